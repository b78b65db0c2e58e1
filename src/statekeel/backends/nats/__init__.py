"""NATS JetStream: the audit chain and trace spans on replicated streams.

Needs ``pip install 'statekeel[nats]'`` (nats-py).
"""

from __future__ import annotations
