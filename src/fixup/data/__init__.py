"""Data: images and parallel text, read from local files or generated."""
