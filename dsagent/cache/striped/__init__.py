"""This node's part in striped versions: its shares, the window, hand-offs."""
