"""Each input pipeline's share of a task's data: the public names of trainer/library/inputs.py."""

from trainer.library.inputs import DATA, FILE, shard, shard_files, shard_records, sharding_mode, without_autoshard

__all__ = ["DATA", "FILE", "shard", "shard_files", "shard_records", "sharding_mode", "without_autoshard"]
