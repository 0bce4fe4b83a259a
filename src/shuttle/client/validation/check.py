"""``check``: ask the node for the version before using cached data (NFS's baseline).

Every open costs one round trip (a stat); cached blocks are used only if the version
still matches. Reads after the open carry that version, so a change on the node
between open and read is an error (``VersionMismatchError``), never a silent mix.
"""

from __future__ import annotations

from shuttle.client.validation.base import Validated, ValidationMode


class CheckMode(ValidationMode):
    name = "check"

    def open(self, key: str) -> Validated:
        info = self.client.stat(key)
        return Validated(info, self.client.cache.validate(info))
