"""The model layer: the one attention function (with the chapter's injected bugs and QK-norm),
TinyGPT, its KV cache and memory accounting, and the attention-implementation setting
(`attention.impl`: the one place a user's function is loaded). Imports only the modules at the
top of the package (config, files, progress, ...)."""
