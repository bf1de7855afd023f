"""The publication gate (`gate.publish`) and the declarations of every published field (`fields`).

Floor 1: imports only `components.core`. Every stage that lets a value out of the private area calls
`publish(channel, doc)`; docs/privacy/publication.md explains the kinds and the neighbour harness."""
from components.publication.gate import Field, Kind, Published, declared, publish, recording
from components.publication import fields  # noqa: F401,E402  (registers every declaration)

__all__ = ["Field", "Kind", "Published", "declared", "publish", "recording"]
