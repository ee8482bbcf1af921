"""Helpers of the security suite (tests/ on sys.path for support.py)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from support import apply_dataset, s3_mount  # noqa: E402,F401
