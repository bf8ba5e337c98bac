"""Layer-level image distribution: a changed image moves only the layers the receivers lack.

- chain      chain IDs, the prefix of rank 0's chain a node holds, blob labels, relay thresholds
- tarstream  `docker save`'s tar read as it streams: which member is which layer's blob (both layouts)
- engine     what this node's docker engine holds (its images' layers, its image store), on its socket
- plan       rank 0's plan: each worker's held prefix, whether layers may be left out at all
- store      the shared cache: each layer blob once, a small index per image, a tar built from them
- prune      the cache's entries by age and size, then every blob no index names
- cli        `slurm-multi layers plan|held|filter|cache-put|cache-tar|prune`

The relay's side (a stream in labelled sections, each link carrying what the nodes below it lack)
is slurm_multi.relay.sections.

docs/image-cache.md and docs/relay.md tell the story.
"""
