"""Small training jobs written the way users write them, for trying `peakmem estimate`."""
