"""The data layer: the Tang-poetry corpus (fetched, pinned, verified) and its character
tokenizer; charlm_sentences.txt, the companion char LM's eight sentences. Imports only the
modules at the top of the package."""
