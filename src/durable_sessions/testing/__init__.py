"""A conformance suite for ``Store`` implementations (needs the ``testing`` extra: pytest).

Subclass ``StoreContract`` in a test module and provide a ``store`` fixture; pytest then
runs every test of the contract against it. See ``StoreContract``.
"""

from __future__ import annotations

from .contract import StoreContract

__all__ = ["StoreContract"]
