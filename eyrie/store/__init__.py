"""The shard store: one Zarr store per shard, its codecs, lock, writers (a thread or a process)."""
