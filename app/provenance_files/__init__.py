"""Provenance on files: C2PA manifests on the files `swapcast swap` writes, and watermark scans of files and
live pulls. It sits above `app/media` (it reads and writes media); the mark itself (`app/provenance`) sits
below it, so that an output stage can mark frames."""
