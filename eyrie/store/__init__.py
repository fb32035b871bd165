"""The shard store: one Zarr store per shard, its codecs, lock, writer thread, comparison."""
