"""The publication gate (`gate.publish`) and the declarations of every published field (`fields`).

Floor 1: imports only `components.core`. Every stage that lets a value out of the private area calls
`publish(channel, doc)`; docs/privacy/publication.md explains the kinds and the neighbour harness."""
from components.publication.gate import Field, Kind, Published, declared, publish, recording

__all__ = ["Field", "Kind", "Published", "declared", "publish", "recording"]
