"""Are the committed outputs still the run that made them? dvc.lock's md5s and params (`lock.py`), and the
runs behind the metrics: the run folders a stage keeps, the run store's summaries, the sweeps made again from
the store (`records.py`). Each finding is a problem `attnrepro check` lists; the verdict itself is judge/'s.
Imports the layers below it and the top modules; never judge, report or commands."""
