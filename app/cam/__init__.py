"""`swapcast cam`: a local camera through a remote swapcast server into a virtual camera or a window."""
