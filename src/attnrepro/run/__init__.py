"""The run layer: one training run as a pure function of a typed RunSpec (spec, the training loop,
the three tasks, execute and its key), the run store (verified entries, remote, migration), the
golden outputs, and the engine that fans many runs out on Dask. Imports data, model, measure and
the top modules; never experiments or anything above."""
