"""The report layer: assembling the sections each experiment writes into report/REPORT.md and its
HTML page, the figures, the claims and machine tables, the README's generated parts and the
headline DVC shows. Imports every layer below it; never commands."""
