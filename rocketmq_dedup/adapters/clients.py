"""Which RocketMQ client this environment has: the classic ``rocketmq-client-python``
(the ``[rocketmq]`` extra) or the 5.x ``rocketmq-python-client`` (``[rocketmq5]``).

The two install the same top-level package, ``rocketmq``: installed together, the second one
overwrites the first one's ``rocketmq/__init__.py`` (and uninstalling either deletes it), so the
package is neither client whole. pip cannot refuse the pair (extras cannot declare a conflict),
so the adapters refuse it when they are used: :func:`check_one_client` raises
:class:`~rocketmq_dedup.errors.ClientConflictError`, saying whose ``__init__.py`` the shared
package has now and how to get back to one client. Read from the installed distributions'
metadata once per process (no client is imported).
"""

from __future__ import annotations

import base64
import functools
import hashlib
from importlib import metadata
from pathlib import Path
from typing import Dict, Optional, Tuple

from rocketmq_dedup.errors import ClientConflictError

#: The two clients' distributions, with the extra that installs each.
CLIENTS: Dict[str, str] = {
    "rocketmq-client-python": "rocketmq",
    "rocketmq-python-client": "rocketmq5",
}
_SHARED_FILE = "rocketmq/__init__.py"


@functools.cache
def installed_clients() -> Tuple[str, ...]:
    """The RocketMQ client distributions installed here (0, 1 or, wrongly, 2 of them)."""
    found = []
    for name in CLIENTS:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found.append(name)
    return tuple(found)


def check_one_client() -> None:
    """Raise :class:`ClientConflictError` when both clients are installed."""
    clients = installed_clients()
    if len(clients) < 2:
        return
    owner = _owner_of_shared_package()
    now = f"its {_SHARED_FILE} is {owner}'s" if owner else f"its {_SHARED_FILE} is neither's"
    raise ClientConflictError(
        "both RocketMQ clients are installed in this environment, rocketmq-client-python "
        "(classic, the [rocketmq] extra) and rocketmq-python-client (5.x, [rocketmq5]); they "
        f"install the same package, rocketmq, over each other ({now}), so neither works "
        "whole. Keep one per environment: pip uninstall -y rocketmq-client-python "
        "rocketmq-python-client, then pip install 'rocketmq-dedup[rocketmq]' or "
        "'rocketmq-dedup[rocketmq5]'"
    )


def _owner_of_shared_package() -> Optional[str]:
    """The client whose recorded ``rocketmq/__init__.py`` is the file on disk now, if any."""
    for name in CLIENTS:
        dist = metadata.distribution(name)
        for path in dist.files or ():
            if path.as_posix() != _SHARED_FILE or path.hash is None:
                continue
            try:
                data = Path(path.locate()).read_bytes()
            except OSError:
                continue
            digest = hashlib.new(path.hash.mode, data).digest()
            if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == path.hash.value:
                return name
    return None


__all__ = ["CLIENTS", "check_one_client", "installed_clients"]
