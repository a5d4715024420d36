"""One module per experiment (a DVC stage's science): its params section (a Config dataclass), its
`run`, and its section of the report (`answer`, its Markdown). protocol.py holds what the chapter's
training experiments share. Imports run, measure, model, data and the top modules."""
