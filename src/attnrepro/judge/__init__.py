"""The verdict: claims.yaml and the conclusions' predicates, the reference read from a git
revision, and `attnrepro check`. Imports the layers below it (experiments for their plans and
constants) and the top modules; never report or commands."""
