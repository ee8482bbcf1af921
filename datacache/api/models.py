"""Resource models: Dataset, CacheRuntime, ThinRuntime(Profile) and DataLoad under ``datacache.io/v1alpha1``.

Resources are Kubernetes-shaped (``apiVersion``, ``kind``, ``metadata``, ``spec``, ``status``) and
use Fluid's field names, camelCase in YAML. Python code uses snake_case attributes (both spellings
are accepted on construction); :func:`datacache.api.loader.to_document` writes camelCase back.

Every model forbids unknown fields, so a typo is an error rather than a silently ignored setting.
Validators that find a problem below the model they run on raise :class:`FieldProblems`, which
carries field paths relative to that model; the loader turns them into located one-line messages.

Units: sizes are Kubernetes quantities (``64Mi`` = 67108864 bytes, see :mod:`.quantity`) kept as
written, with ``*_bytes`` properties giving integers; durations are seconds.
"""

from __future__ import annotations

import datetime
import os
import re
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from .quantity import parse_quantity
from datacache.ufs.retry import option_problems
from datacache.ufs.schemes import RUNTIME_PLUGIN_GROUP, SCHEME_PATTERN, known_schemes, plugin_schemes, register_scheme

__all__ = [
    "API_VERSION",
    "FieldProblems",
    "register_scheme",
    "known_schemes",
    "RUNTIME_PLUGIN_GROUP",
    "plugin_schemes",
    "ObjectMeta",
    "SecretKeySelector",
    "EncryptOptionSource",
    "EncryptOption",
    "Mount",
    "DatasetSpec",
    "Condition",
    "CacheStates",
    "DatasetStatus",
    "Dataset",
    "Level",
    "TieredStore",
    "FuseSpec",
    "WorkerSpec",
    "AutoscalePolicy",
    "CacheRuntimeSpec",
    "RuntimeStatus",
    "CacheRuntime",
    "PlainOptions",
    "ThinFuseCommand",
    "ThinRuntimeProfileSpec",
    "ThinRuntimeProfile",
    "ThinRuntimeSpec",
    "ThinRuntime",
    "RunAfter",
    "JuiceFSFuseSpec",
    "JuiceFSRuntimeSpec",
    "JuiceFSRuntime",
    "DataLoadDataset",
    "DataLoadTarget",
    "DataLoadSpec",
    "TargetStatus",
    "DataLoadStatus",
    "DataLoad",
    "Quota",
    "BlockSize",
    "describe",
]

API_VERSION = "datacache.io/v1alpha1"

Loc = tuple[Union[str, int], ...]


class FieldProblems(ValueError):
    """Problems found by a validator, each located relative to the model that raised it.

    ``problems`` is a list of ``(sub_path, message)`` where ``sub_path`` is a tuple of YAML field
    names and list indexes, e.g. ``(("mounts", 1, "path"), "...")``.
    """

    def __init__(self, problems: list[tuple[Loc, str]]):
        self.problems = list(problems)
        super().__init__("; ".join(message for _, message in self.problems))


class _Model(BaseModel):
    """Base of all models: camelCase aliases, snake_case attributes, unknown fields forbidden, and
    no ``true``/``false`` where a number or quantity goes (pydantic's lax mode reads them as 1 and
    0: ``quota: true`` was a one-byte quota, ``high: true`` a watermark of 1)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name and _numeric_only(cls.model_fields[info.field_name].annotation):
            words = "true, yes or on" if value else "false, no or off"  # YAML 1.1 booleans
            raise ValueError(f"must be a number, got {words} (a boolean to YAML)")
        return value


def _numeric_only(annotation: Any) -> bool:
    """True when ``annotation`` takes numbers (int, float, a quantity) and not booleans."""
    found: set[type] = set()

    def walk(a: Any) -> None:
        if a in (int, float, bool, str) or a is Any:
            found.add(object if a is Any else a)
        for arg in get_args(a):
            walk(arg)

    walk(annotation)
    return bool(found & {int, float}) and not found & {bool, object}


# --- names --------------------------------------------------------------------------------------

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _check_dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise ValueError(
            f"'{value}' is not a valid name: use lowercase letters, digits and '-' "
            "(RFC 1123 label, at most 63 characters)"
        )
    return value


def _check_dns_subdomain(value: str) -> str:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError(
            f"'{value}' is not a valid name: use lowercase letters, digits, '-' and '.' "
            "(RFC 1123 subdomain, at most 253 characters)"
        )
    return value


DnsLabel = Annotated[
    str,
    AfterValidator(_check_dns_label),
    Field(json_schema_extra={"pattern": _DNS_LABEL.pattern, "maxLength": 63}),
]
DnsSubdomain = Annotated[
    str,
    AfterValidator(_check_dns_subdomain),
    Field(json_schema_extra={"pattern": _DNS_SUBDOMAIN.pattern, "maxLength": 253}),
]


# --- times --------------------------------------------------------------------------------------


def _timestamp(value: Any) -> Any:
    # YAML reads an unquoted 2024-05-01T10:00:00Z as a datetime: keep it as RFC 3339 text.
    if isinstance(value, (datetime.datetime, datetime.date)):
        text = value.isoformat()
        return text.replace("+00:00", "Z") if isinstance(value, datetime.datetime) else text
    return value


Timestamp = Annotated[str, BeforeValidator(_timestamp)]
"""An RFC 3339 time as text (``2024-05-01T10:00:00Z``); a YAML datetime is converted."""


# --- quantities ---------------------------------------------------------------------------------


def _quantity(min_bytes: int = 0, max_bytes: int | None = None, multiple_of: int = 1) -> Any:
    """A quantity field (``str`` as written, or ``int`` bytes) checked to lie within bounds."""

    def check(value: Any) -> Any:
        if isinstance(value, float):
            value = repr(value)
        n = parse_quantity(value)  # ValueError says which forms are accepted
        shown = value if isinstance(value, int) else f"'{value}'"
        if n < min_bytes:
            raise ValueError(
                f"must be greater than zero, got {shown}"
                if min_bytes == 1
                else f"{shown} is {n} bytes, below the minimum of {min_bytes} bytes"
            )
        if max_bytes is not None and n > max_bytes:
            raise ValueError(f"{shown} is {n} bytes, above the maximum of {max_bytes} bytes")
        if n % multiple_of:
            raise ValueError(f"{shown} is {n} bytes, not a multiple of {multiple_of} bytes")
        return value.strip() if isinstance(value, str) else value

    return Annotated[
        Union[str, int],
        BeforeValidator(check),
        Field(json_schema_extra={"x-kubernetes-int-or-string": True}),
    ]


Quota = _quantity(min_bytes=1)
"""A level's quota: a quantity greater than zero."""
FileTierQuota = _quantity(min_bytes=0)
"""The file tier's quota: a quantity, 0 turning the tier off."""
BlockSize = _quantity(min_bytes=64 * 1024, max_bytes=64 * 1024**2, multiple_of=4096)
"""A block size: a quantity between 64Ki and 64Mi, a multiple of 4096 bytes."""


# --- schemes ------------------------------------------------------------------------------------

# Shown first in "known: ..." lists: the schemes users most likely meant.
_POPULAR_SCHEMES = ("s3", "gs", "az", "http", "https", "file", "memory", "sftp")
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$")
_PLACEHOLDER = re.compile(r"\$\{(?P<var>[^}]*)\}")


def _unfilled(value: str) -> str:
    """'' or why ``value`` still holds a template's ``${VAR}`` placeholder (example files ship them)."""
    names = [m["var"] for m in _PLACEHOLDER.finditer(value)]
    if not names:
        return ""
    return (f"'{value}' holds the unfilled placeholder(s) {', '.join('${' + n + '}' for n in names)}: replace "
            "them with your own values (the comment at the top of the example file says what each one is)")


def _scheme_list(known: frozenset[str]) -> str:
    shown = [s for s in _POPULAR_SCHEMES if s in known]
    return ", ".join(shown + ["..."])


# --- metadata -----------------------------------------------------------------------------------


class ObjectMeta(_Model):
    """``metadata``: the resource's name and namespace (RFC 1123 labels), labels and annotations."""

    name: DnsLabel
    namespace: DnsLabel = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    creation_timestamp: Timestamp | None = None  # RFC 3339, set by the control plane


class Condition(_Model):
    """A status condition, as in Kubernetes: ``type`` is ``True``/``False``/``Unknown`` since a time."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: Timestamp | None = None


# --- Dataset ------------------------------------------------------------------------------------


class SecretKeySelector(_Model):
    """One key of a Secret (Kubernetes), or of the local secret store in embedded mode."""

    name: DnsSubdomain
    key: Annotated[str, Field(min_length=1, pattern=r"^[-._a-zA-Z0-9]+$")]


class EncryptOptionSource(_Model):
    """Where an encrypted option's value comes from: only ``secretKeyRef`` is supported."""

    secret_key_ref: SecretKeySelector


class EncryptOption(_Model):
    """An fsspec option whose value is secret (``name`` is the option, e.g. ``secret``)."""

    name: Annotated[str, Field(min_length=1)]
    value_from: EncryptOptionSource

    @model_validator(mode="before")
    @classmethod
    def _no_inline_value(cls, data: Any) -> Any:
        if isinstance(data, dict) and "value" in data:
            raise FieldProblems([(
                ("value",),
                "inline secret values are not allowed: store the value in a Secret and "
                "reference it with valueFrom.secretKeyRef {name, key}",
            )])
        return data


# Option names whose values are credentials: they belong in encryptOptions, never in plain YAML.
_SECRET_OPTION_NAMES = frozenset({
    "secret", "password", "token", "session_token", "secret_access_key", "aws_secret_access_key",
    "aws_session_token", "account_key", "sas_token", "client_secret", "metaurl", "secret-key",
})


class Mount(_Model):
    """One source (UFS) of a Dataset.

    ``mount_point`` is ``scheme://...`` or an absolute local path (meaning ``file://``);
    ``path`` is where the mount appears in the dataset namespace; after a :class:`DatasetSpec` is
    validated it is always set (``/`` for a single mount, else ``/{name}``, as in Fluid).
    ``options`` go to the fsspec filesystem as keyword arguments.
    """

    name: DnsLabel
    mount_point: str
    path: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    encrypt_options: list[EncryptOption] = Field(default_factory=list)
    read_only: bool = True

    @field_validator("mount_point")
    @classmethod
    def _check_mount_point(cls, value: str) -> str:
        if _unfilled(value):
            raise ValueError(_unfilled(value))
        if value.startswith("/"):
            return value
        match = _URL.match(value)
        if match is None:
            raise ValueError(
                f"'{value}' is neither a URL nor an absolute path: write scheme://... "
                "(e.g. s3://bucket/prefix) or /absolute/local/path"
            )
        scheme = match["scheme"].lower()
        known = known_schemes()
        if scheme not in known and scheme not in plugin_schemes():
            raise ValueError(f"unsupported scheme '{match['scheme']}' (known: {_scheme_list(known)})")
        return value

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str | None) -> str | None:
        if value is not None:
            _check_namespace_path(value, "mount path")
        return value

    @field_validator("options")
    @classmethod
    def _check_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        problems: list[tuple[Loc, str]] = []
        for key, item in value.items():
            if key.lower() in _SECRET_OPTION_NAMES:
                problems.append(((key,), (
                    f"'{key}' is a credential: do not write it in plain text, put it in a Secret "
                    "and reference it from encryptOptions (valueFrom.secretKeyRef)"
                )))
            elif not isinstance(item, (str, int, float, bool)):
                problems.append(((key,), f"expected a string, number or boolean, got {describe(item)}"))
            elif isinstance(item, str) and _unfilled(item):
                problems.append(((key,), _unfilled(item)))
        problems += [((key,), msg) for key, msg in option_problems(value)]  # UFS timeouts, retries
        if problems:
            raise FieldProblems(problems)
        return value

    @model_validator(mode="after")
    def _check_encrypt_options(self) -> "Mount":
        problems: list[tuple[Loc, str]] = []
        seen: dict[str, int] = {}
        for i, option in enumerate(self.encrypt_options):
            if option.name in seen:
                problems.append((("encryptOptions", i, "name"),
                                 f"duplicate option '{option.name}' (also encryptOptions[{seen[option.name]}])"))
            elif option.name in self.options:
                problems.append((("encryptOptions", i, "name"),
                                 f"option '{option.name}' is also set in options: set it in one place"))
            seen.setdefault(option.name, i)
        if problems:
            raise FieldProblems(problems)
        return self

    @property
    def scheme(self) -> str:
        """The UFS scheme, lowercase: ``s3`` for ``s3://b/p``, ``file`` for ``/data``."""
        if self.mount_point.startswith("/"):
            return "file"
        return self.mount_point.split("://", 1)[0].lower()


def _check_namespace_path(value: str, what: str) -> None:
    """Raise ``ValueError`` unless ``value`` is an absolute, normalised path without '..'."""
    if not value.startswith("/"):
        raise ValueError(f"{what} '{value}' must be absolute (start with '/')")
    parts = value.split("/")[1:]
    if ".." in parts:
        raise ValueError(f"{what} '{value}' must not contain '..'")
    normal = "/" + "/".join(p for p in parts if p not in ("", "."))
    if value != normal:
        raise ValueError(f"{what} '{value}' is not normalised: write '{normal}'")


def _is_within(child: str, parent: str) -> bool:
    return parent == "/" or child.startswith(parent + "/")


class DatasetSpec(_Model):
    """``Dataset.spec``: the mounts aggregated into one namespace, and where the cache may live."""

    mounts: Annotated[list[Mount], Field(min_length=1)]
    access_modes: list[Literal["ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"]] = Field(
        default_factory=lambda: ["ReadOnlyMany"]
    )
    placement: Literal["Exclusive", "Shared"] = "Exclusive"
    node_affinity: dict[str, Any] | None = None
    auto_sync_interval: Annotated[int, Field(ge=0)] | None = None  # seconds; None: no automatic sync

    @model_validator(mode="after")
    def _fill_and_check_mounts(self) -> "DatasetSpec":
        defaulted = set()
        for i, mount in enumerate(self.mounts):
            if mount.path is None:
                mount.path = "/" if len(self.mounts) == 1 else f"/{mount.name}"
                defaulted.add(i)
        problems: list[tuple[Loc, str]] = []
        first_by_name: dict[str, int] = {}
        for i, mount in enumerate(self.mounts):
            if mount.name in first_by_name:
                problems.append((("mounts", i, "name"),
                                 f"duplicate mount name '{mount.name}' (also mounts[{first_by_name[mount.name]}])"))
            else:
                first_by_name[mount.name] = i

        def where(i: int) -> str:
            m = self.mounts[i]
            note = " (the default path)" if i in defaulted else ""
            return f"mount '{m.name}' at '{m.path}'{note}"

        for j, b in enumerate(self.mounts):
            for i, a in enumerate(self.mounts[:j]):
                if a.name == b.name:
                    continue  # already reported as a duplicate name
                assert a.path is not None and b.path is not None
                if a.path == b.path:
                    msg = f"{where(j)} has the same path as {where(i)}: give each mount its own path"
                elif _is_within(b.path, a.path):
                    msg = f"{where(j)} is inside {where(i)}: mount paths must not be nested"
                elif _is_within(a.path, b.path):
                    msg = f"{where(j)} contains {where(i)}: mount paths must not be nested"
                else:
                    continue
                problems.append((("mounts", j, "path"), msg))
        if problems:
            raise FieldProblems(problems)
        return self


class CacheStates(_Model):
    """Cache figures shown by ``datacache get datasets`` (sizes as formatted by ``format_bytes``)."""

    cached: str | None = None  # the current versions' blocks
    old_versions_cached: str | None = None  # blocks of versions no manifest names now, until evicted
    cache_capacity: str | None = None
    cached_percentage: str | None = None
    cache_hit_ratio: str | None = None
    local_hit_ratio: str | None = None
    remote_hit_ratio: str | None = None
    last_trace_cached: str | None = None  # of the bytes the last recorded run read ('-': none recorded)


class DatasetStatus(_Model):
    """``Dataset.status``, written by the control plane."""

    phase: Literal["Pending", "Bound", "NotBound", "Failed", "Updating"] = "Pending"
    conditions: list[Condition] = Field(default_factory=list)
    ufs_total: str | None = None
    file_num: int | None = None
    cache_states: CacheStates | None = None
    mounts: list[Mount] | None = None


class Dataset(_Model):
    """A Dataset: one namespace aggregating the mounts' UFSes."""

    api_version: Literal["datacache.io/v1alpha1"] = API_VERSION
    kind: Literal["Dataset"] = "Dataset"
    metadata: ObjectMeta
    spec: DatasetSpec
    status: DatasetStatus | None = None


# --- CacheRuntime -------------------------------------------------------------------------------

_MEDIUM_ORDER = {"MEM": 0, "SSD": 1, "HDD": 2}


class Level(_Model):
    """One tier of the cache: a medium, where it lives, its size and its eviction watermarks.

    ``quota`` is a quantity (kept as written; :attr:`quota_bytes` gives bytes). Eviction starts
    when usage exceeds ``high`` × quota and stops below ``low`` × quota (fractions in (0, 1]).
    ``freeSpaceRatio``: the fraction of a disk level's device that its puts leave free, evicting
    the level's own blocks for it (JuiceFS's ``--free-space-ratio``; unset: the node's
    ``DATACACHE_FREE_SPACE_RATIO``, else 0.1). ``path`` is a directory; a relative one is taken
    relative to ``$DATACACHE_HOME`` in embedded mode (so example files work on any machine).
    """

    mediumtype: Literal["MEM", "SSD", "HDD"]
    path: str | None = None
    quota: Quota
    high: Annotated[float, Field(gt=0, le=1)] = 0.95
    low: Annotated[float, Field(ge=0, lt=1)] = 0.7
    free_space_ratio: Annotated[float, Field(ge=0, lt=1)] | None = None

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or "\0" in value or ".." in value.split("/")):
            raise ValueError(f"'{value}' is not a usable directory path: give an absolute path or one "
                             "relative to $DATACACHE_HOME, without '..'")
        return value

    @model_validator(mode="after")
    def _check_level(self) -> "Level":
        problems: list[tuple[Loc, str]] = []
        if self.path is None and self.mediumtype != "MEM":
            problems.append((("path",), f"missing required field: the {self.mediumtype} level needs a directory"))
        if self.free_space_ratio is not None and self.mediumtype == "MEM":
            problems.append((("freeSpaceRatio",), "is the share of a disk level's device kept free: give it on "
                                                  "the SSD or HDD level, not the MEM one"))
        if self.low >= self.high:
            problems.append((("low",), f"low watermark {self.low:g} must be below high watermark {self.high:g}"))
        if problems:
            raise FieldProblems(problems)
        return self

    @property
    def quota_bytes(self) -> int:
        """The quota in bytes."""
        return parse_quantity(self.quota)

    def directory(self, home: str, namespace: str, name: str) -> str:
        """This disk level's directory for runtime ``namespace``/``name``: ``<path>/<ns>/<name>``,
        a relative ``path`` (or ``~``) taken relative to ``home`` ($DATACACHE_HOME)."""
        return os.path.join(home, os.path.expanduser(self.path), namespace, name)


class FileTierSpec(_Model):
    """``tieredstore.fileTier``: for runtimes with cache workers (their blocks spread over them),
    copies of complete file versions of more than one block kept on this node as one contiguous
    local file each (``datacache.cache.filetier``), which FUSE passthrough and ``datacache://``
    hand out as plain files. With the in-process cache it is accepted and unused: the disk level
    keeps one cache file per version and hands that out, with no copy. ``quota``: bytes (``0``
    turns it off; default: the first disk level's quota); ``path``: its directory (default:
    beside the first disk level's, ``<level path>/<ns>/<name>.files``); watermarks as for a
    level."""

    path: str | None = None
    quota: FileTierQuota | None = None
    high: Annotated[float, Field(gt=0, le=1)] = 0.95
    low: Annotated[float, Field(ge=0, lt=1)] = 0.8

    @model_validator(mode="after")
    def _check_watermarks(self) -> "FileTierSpec":
        if self.low >= self.high:
            raise FieldProblems([(("low",), f"low watermark {self.low:g} must be below high watermark {self.high:g}")])
        return self


class TieredStore(_Model):
    """``tieredstore``: the cache tiers, at most one per medium, and the file tier (``fileTier``)."""

    levels: Annotated[list[Level], Field(min_length=1)]
    file_tier: FileTierSpec = Field(default_factory=FileTierSpec)

    @model_validator(mode="after")
    def _check_levels(self) -> "TieredStore":
        problems: list[tuple[Loc, str]] = []
        by_medium: dict[str, int] = {}
        by_path: dict[str, int] = {}
        for i, level in enumerate(self.levels):
            if level.mediumtype in by_medium:
                problems.append((("levels", i, "mediumtype"), (
                    f"duplicate level '{level.mediumtype}' (also levels[{by_medium[level.mediumtype]}]): "
                    "use one level per medium"
                )))
            by_medium.setdefault(level.mediumtype, i)
            if level.path is not None:
                if level.path in by_path:
                    problems.append((("levels", i, "path"),
                                     f"path '{level.path}' is also used by levels[{by_path[level.path]}]"))
                by_path.setdefault(level.path, i)
        if problems:
            raise FieldProblems(problems)
        return self

    @property
    def ordered_levels(self) -> list[Level]:
        """The levels from fastest to slowest: MEM, SSD, HDD."""
        return sorted(self.levels, key=lambda level: _MEDIUM_ORDER[level.mediumtype])


class FuseSpec(_Model):
    """``fuse``: mount options (``-o`` style, name → value), read-ahead in blocks, and how long the
    kernel may cache entries and attributes (seconds; default 7,200, Fluid's ``attr_timeout`` and
    ``entry_timeout`` for its FUSE clients: the mount pushes every change of the manifest to the
    kernel as an invalidation, so the timeout only bounds what a lost one leaves; a short one makes
    every epoch longer than it look each file up again). ``scan_warmup``: a cold epoch over a
    directory tree that fits in half the cache gets the rest of the tree loaded in the background
    (:mod:`datacache.scan_warmup`); false turns it off."""

    options: dict[str, str] = Field(default_factory=dict)
    read_ahead_blocks: Annotated[int, Field(ge=0)] = 4
    attr_timeout: Annotated[float, Field(ge=0)] = 7200.0
    scan_warmup: bool = True


class WorkerSpec(_Model):
    """``worker``: the cache worker's TCP port (None: chosen by the control plane)."""

    port: Annotated[int, Field(ge=1, le=65535)] | None = None


class AutoscalePolicy(_Model):
    """``CacheRuntime.spec.autoscale``: how many workers to run from the workers' capacity-used rate.

    The rate is Σ used bytes / Σ capacity bytes over the ready workers. Above
    ``target_used_ratio`` the runtime grows by ``scale_up_step`` workers (at most
    ``max_replicas``); with ``scale_down: Gated`` it shrinks by one worker only after the rate
    stayed below ``target_used_ratio - scale_down_margin`` for a whole ``cooldown`` (seconds), and
    never below ``min_replicas``. No two scalings happen within one ``cooldown``.
    :func:`datacache.control.autoscale.decide` evaluates it.
    """

    min_replicas: Annotated[int, Field(ge=0)] = 1
    max_replicas: Annotated[int, Field(ge=1)]
    target_used_ratio: Annotated[float, Field(gt=0, le=1)] = 0.8
    scale_up_step: Annotated[int, Field(ge=1)] = 1
    cooldown: Annotated[float, Field(ge=0)] = 300.0
    scale_down: Literal["Disabled", "Gated"] = "Disabled"
    scale_down_margin: Annotated[float, Field(ge=0, lt=1)] = 0.2

    @model_validator(mode="after")
    def _check_bounds(self) -> "AutoscalePolicy":
        problems: list[tuple[Loc, str]] = []
        if self.max_replicas < self.min_replicas:
            problems.append((("maxReplicas",), (
                f"maxReplicas {self.max_replicas} is below minReplicas {self.min_replicas}: "
                "raise maxReplicas or lower minReplicas"
            )))
        if self.scale_down == "Gated" and self.scale_down_margin >= self.target_used_ratio:
            problems.append((("scaleDownMargin",), (
                f"scaleDownMargin {self.scale_down_margin:g} must be below targetUsedRatio "
                f"{self.target_used_ratio:g}, else scale-in can never happen"
            )))
        if problems:
            raise FieldProblems(problems)
        return self


class CacheRuntimeSpec(_Model):
    """``CacheRuntime.spec``: worker count, block size, tiers, FUSE and worker settings, and an
    optional autoscale policy (``replicas`` is then the starting count, kept within its bounds).

    ``block_size`` is a quantity between 64Ki and 64Mi and a multiple of 4096 bytes (default 4Mi).
    """

    replicas: Annotated[int, Field(ge=0)] = 1
    block_size: BlockSize = "4Mi"
    tieredstore: TieredStore
    fuse: FuseSpec = Field(default_factory=FuseSpec)
    worker: WorkerSpec = Field(default_factory=WorkerSpec)
    autoscale: AutoscalePolicy | None = None

    @property
    def block_size_bytes(self) -> int:
        """The block size in bytes."""
        return parse_quantity(self.block_size)


class RuntimeStatus(_Model):
    """``CacheRuntime.status``, written by the control plane (sizes as ``format_bytes`` prints them)."""

    phase: Literal["Pending", "NotReady", "PartialReady", "Ready", "Failed"] = "Pending"
    desired_workers: int | None = None
    ready_workers: int | None = None
    cache_capacity: str | None = None
    cached: str | None = None
    workers: list[dict[str, Any]] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)
    last_scale_time: Timestamp | None = None  # when the autoscaler last changed replicas


class CacheRuntime(_Model):
    """The built-in cache engine for the Dataset of the same name and namespace."""

    api_version: Literal["datacache.io/v1alpha1"] = API_VERSION
    kind: Literal["CacheRuntime"] = "CacheRuntime"
    metadata: ObjectMeta
    spec: CacheRuntimeSpec
    status: RuntimeStatus | None = None


# --- ThinRuntime --------------------------------------------------------------------------------

PlainOptions = Annotated[dict[str, Any], AfterValidator(lambda value: Mount._check_options(value))]
"""Options for a runtime: strings, numbers and booleans; credentials only through secret refs."""


class ThinFuseCommand(_Model):
    """``fuse`` of a ThinRuntimeProfile: a command that mounts the storage and stays in the foreground.

    ``command`` is an argv list, never a shell string: every item is one argument, passed as written
    except that ``$(DATACACHE_THIN_CONFIG)`` and ``$(DATACACHE_THIN_TARGET)`` become the config
    file's path and the target directory. ``mount_timeout`` (seconds) bounds the wait for the mount.
    """

    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    mount_timeout: Annotated[float, Field(gt=0, le=600)] = 30.0

    @field_validator("command", mode="before")
    @classmethod
    def _argv_only(cls, value: Any) -> Any:
        return argv_only(value)


def argv_only(value: Any) -> Any:
    """``value`` unchanged unless it is a string: raise ``ValueError`` asking for an argv list."""
    if isinstance(value, str):
        raise ValueError(f"{describe(value)} is a string: write the command as an argv list, one item "
                         f"per argument (e.g. {value.split()!r}); it never runs through a shell")
    return value


class ThinRuntimeProfileSpec(_Model):
    """How a self-built filesystem plugs in: exactly one of ``plugin`` (the name of an entry point in
    group ``datacache.runtimes``) or ``fuse`` (a FUSE command). ``options`` are defaults that the
    ThinRuntime's and each mount's options override. ``file_system_type`` may be used as a mount's
    URL scheme (it is registered with :func:`register_scheme`)."""

    file_system_type: Annotated[str, Field(pattern=SCHEME_PATTERN, max_length=63)]
    plugin: Annotated[str, Field(min_length=1)] | None = None
    fuse: ThinFuseCommand | None = None
    options: PlainOptions = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_way_in(self) -> "ThinRuntimeProfileSpec":
        if (self.plugin is None) == (self.fuse is None):
            raise FieldProblems([((), (
                "set exactly one of plugin (an entry point in group 'datacache.runtimes') "
                "or fuse.command (a FUSE command as an argv list)"
            ))])
        register_scheme(self.file_system_type)
        return self


class ThinRuntimeProfile(_Model):
    """A cluster-wide way to reach a self-built filesystem, named by ThinRuntimes' ``profileName``.

    Cluster-scoped: ``metadata.namespace`` is ignored (kept as ``default``)."""

    api_version: Literal["datacache.io/v1alpha1"] = API_VERSION
    kind: Literal["ThinRuntimeProfile"] = "ThinRuntimeProfile"
    metadata: ObjectMeta
    spec: ThinRuntimeProfileSpec

    @field_validator("metadata")
    @classmethod
    def _cluster_scoped(cls, meta: ObjectMeta) -> ObjectMeta:
        meta.namespace = "default"
        return meta


class ThinRuntimeSpec(CacheRuntimeSpec):
    """``ThinRuntime.spec``: the profile and its ``options`` (over the profile's), and the cache on
    top: the same tiers, block size, FUSE and worker fields as a CacheRuntime. Its cache runs in
    the reading process (``replicas`` 0 or 1): cache workers do not open a thin runtime's UFS yet."""

    replicas: Annotated[int, Field(ge=0, le=1)] = 1
    profile_name: DnsSubdomain
    options: PlainOptions = Field(default_factory=dict)

    @model_validator(mode="after")
    def _no_autoscale(self) -> "ThinRuntimeSpec":
        if self.autoscale is not None:
            raise FieldProblems([(("autoscale",), (
                "a ThinRuntime's cache runs in the reading process (replicas 0 or 1): autoscale is "
                "only for CacheRuntimes; remove it"
            ))])
        return self


class ThinRuntime(_Model):
    """A runtime whose UFS comes from a ThinRuntimeProfile, for the Dataset of the same name."""

    api_version: Literal["datacache.io/v1alpha1"] = API_VERSION
    kind: Literal["ThinRuntime"] = "ThinRuntime"
    metadata: ObjectMeta
    spec: ThinRuntimeSpec
    status: RuntimeStatus | None = None


# --- JuiceFSRuntime -----------------------------------------------------------------------------

JUICEFS_SCHEME = "juicefs"
register_scheme(JUICEFS_SCHEME)  # a Dataset mount 'juicefs:///[sub/dir]' names a JuiceFS volume
JUICEFS_SECRETS = frozenset({"metaurl", "access-key", "secret-key"})
"""A ``juicefs://`` mount's ``encryptOptions`` (Fluid's names): ``metaurl`` (required), and the
object-storage keys when the volume's own are not to be used. The volume is formatted already
(``juicefs format``); a juicefs mount takes no plain ``options``."""


class JuiceFSFuseSpec(_Model):
    """``JuiceFSRuntime.spec.fuse``: ``options`` passed to ``juicefs mount`` as ``--NAME=VALUE``
    (``--NAME`` alone for ``"true"``), e.g. ``{"attr-cache": "10", "read-only": "true"}``."""

    options: dict[str, str] = Field(default_factory=dict)

    @field_validator("options")
    @classmethod
    def _check_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not re.fullmatch(r"[a-z][a-z0-9-]*", k)]
        taken = [k for k in value if k in ("cache-dir", "cache-size", "free-space-ratio", "buffer-size", "subdir",
                                            "foreground", "d", "background", "log")]
        problems = []
        if bad:
            problems.append(f"option name(s) {', '.join(map(repr, bad))} are not juicefs mount flags: write the "
                            "flag in lowercase without dashes in front, e.g. attr-cache")
        if value.get("read-only", "true") != "true":
            problems.append("option read-only: a Dataset is read-only, so its juicefs mount is too: remove it")
        if taken:
            problems.append(f"option(s) {', '.join(taken)} are set by datacache (cache dirs, sizes and the "
                            "free-space reserve come from tieredstore, the sub-directory from the Dataset's "
                            "mountPoint): remove them")
        if problems:
            raise ValueError("; ".join(problems))
        return value


class JuiceFSRuntimeSpec(_Model):
    """``JuiceFSRuntime.spec`` (Fluid's JuiceFSRuntime, Community Edition): the JuiceFS client's
    cache and mount flags. Each ``tieredstore`` level becomes JuiceFS cache: SSD/HDD levels
    ``--cache-dir`` (``<path>/<namespace>/<name>``, several joined by ':') and ``--cache-size``
    (the sum of their quotas, in MiB) and ``--free-space-ratio`` (their ``freeSpaceRatio``, unset:
    the node's default); a MEM level ``--buffer-size`` (its quota, in MiB). Disk levels must
    agree on quota and freeSpaceRatio (JuiceFS splits the cache size evenly over its
    directories).
    ``replicas``: 0 or 1 (one JuiceFS client on this machine). ``clean_cache_policy``: on delete,
    ``OnRuntimeDeleted`` removes the cache directories (Fluid cleans the cache on shutdown),
    ``Retain`` keeps them for the next runtime of that name."""

    replicas: Annotated[int, Field(ge=0, le=1)] = 1
    tieredstore: TieredStore | None = None
    fuse: JuiceFSFuseSpec = Field(default_factory=JuiceFSFuseSpec)
    clean_cache_policy: Literal["OnRuntimeDeleted", "Retain"] = "OnRuntimeDeleted"

    @model_validator(mode="after")
    def _check_disk_levels(self) -> "JuiceFSRuntimeSpec":
        """JuiceFS gives each cache directory an equal share of ``--cache-size`` and one
        ``--free-space-ratio`` for all (pkg/chunk/disk_cache.go): disk levels must agree."""
        levels = self.tieredstore.levels if self.tieredstore is not None else []
        disks = [(i, level) for i, level in enumerate(levels) if level.mediumtype != "MEM"]
        problems: list[tuple[Loc, str]] = []
        for i, level in disks[1:]:
            first_i, first = disks[0]
            for field, name in (("quota", "quota"), ("free_space_ratio", "freeSpaceRatio")):
                if getattr(level, field) != getattr(first, field):
                    problems.append((("tieredstore", "levels", i, name), (
                        f"differs from levels[{first_i}].{name}: JuiceFS splits --cache-size evenly over its "
                        "cache directories and keeps one --free-space-ratio for all; give the disk levels the "
                        f"same {name}, or use one disk level")))
        if problems:
            raise FieldProblems(problems)
        return self


class JuiceFSRuntime(_Model):
    """A JuiceFS client as the cache engine of the Dataset of the same name (mount ``juicefs:///``)."""

    api_version: Literal["datacache.io/v1alpha1"] = API_VERSION
    kind: Literal["JuiceFSRuntime"] = "JuiceFSRuntime"
    metadata: ObjectMeta
    spec: JuiceFSRuntimeSpec = Field(default_factory=JuiceFSRuntimeSpec)
    status: RuntimeStatus | None = None


# --- DataLoad -----------------------------------------------------------------------------------

_CRON_FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")),
    ("day of week", 0, 7, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")),
    ("second", 0, 59, ()),  # optional 6th field, as croniter reads it
)
_CRON_ITEM = re.compile(r"^(?:\*|(?P<lo>\w+)(?:-(?P<hi>\w+))?)(?:/(?P<step>\d+))?$")


def _check_cron(schedule: str) -> None:
    """Raise ``ValueError`` unless ``schedule`` is a 5-field cron expression (or 6 fields, the
    last being seconds, as :mod:`croniter` reads it)."""
    fields = schedule.split()
    if len(fields) not in (5, 6):
        raise ValueError(
            f"'{schedule}' has {len(fields)} field(s): a cron schedule has 5 "
            "(minute hour day-of-month month day-of-week, e.g. '0 3 * * *')"
        )
    for text, (what, low, high, names) in zip(fields, _CRON_FIELDS):
        for item in text.split(","):
            match = _CRON_ITEM.match(item)
            ok = match is not None and (match["step"] is None or int(match["step"]) > 0)
            if ok:
                for bound in (match["lo"], match["hi"]):
                    if bound is None:
                        continue
                    if bound.isdigit():
                        ok = ok and low <= int(bound) <= high
                    else:
                        ok = ok and bound.lower() in names
            if not ok:
                raise ValueError(f"'{schedule}': '{text}' is not a valid {what} field ({low}-{high})")
    if len(fields) == 6 and fields[5] == "*":  # Quartz order (seconds first) read as croniter's
        raise ValueError(f"'{schedule}': the 6th field is seconds (croniter's order: minute hour day-of-month "
                         "month day-of-week second) and '*' there fires every second: write 0 for once a "
                         "minute, */N for every N seconds, or drop it for a 5-field schedule")


class RunAfter(_Model):
    """``spec.runAfter`` of a DataLoad, DataMigrate or DataProcess: the operation this one waits
    for, as in Fluid's DataFlow. It starts when that one is Complete and is marked Failed, with
    the reason, when that one fails. ``namespace`` defaults to the waiting resource's own.
    The graph is checked at apply: a missing predecessor or a cycle is refused
    (:mod:`datacache.control.flowgraph`)."""

    kind: Literal["DataLoad", "DataMigrate", "DataProcess"]
    name: DnsLabel
    namespace: DnsLabel | None = None


class DataLoadDataset(_Model):
    """The Dataset a DataLoad warms up."""

    name: DnsLabel
    namespace: DnsLabel = "default"


class DataLoadTarget(_Model):
    """What to load: ``path``, a path in the dataset namespace (a directory, a file or a glob,
    ``/train/*.tar``), or ``trace``, a recorded run of the dataset (``datacache mount --record``,
    ``datacache://`` with ``record``): the files it read, in the order it read them. One of them."""

    path: str | None = None
    trace: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")

    @property
    def label(self) -> str:
        """The target as its status names it: the path, or ``trace:RUN``."""
        return self.path if self.path is not None else f"trace:{self.trace}"

    @model_validator(mode="after")
    def _one_of(self) -> "DataLoadTarget":
        if (self.path is None) == (self.trace is None):
            raise FieldProblems([(("path",), "give either path (a dataset path) or trace (a recorded run)")])
        return self

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith("/"):
            raise ValueError(f"'{value}' must be a path in the dataset namespace, starting with '/'")
        if ".." in value.split("/"):
            raise ValueError(f"'{value}' must not contain '..'")
        return value


class DataLoadSpec(_Model):
    """``DataLoad.spec``: what to load (empty ``target`` means everything) and when.

    ``policy``: ``Once`` (when applied); ``Cron`` on ``schedule`` (5-field cron, or 6 with
    seconds last; required for Cron only), fired by ``datacache controller``; ``OnEvent``
    whenever a metadata sync finds added or changed files under its targets.
    ``load_metadata``: sync the dataset's metadata before loading.
    """

    dataset: DataLoadDataset
    target: list[DataLoadTarget] = Field(default_factory=list)
    load_metadata: bool = False
    policy: Literal["Once", "Cron", "OnEvent"] = "Once"
    schedule: str | None = Field(default=None, description=(
        "Cron schedule (UTC) for policy Cron: 5 fields 'minute hour day-of-month month day-of-week', or 6 "
        "with SECONDS LAST as croniter reads them ('* * * * * */10' = every 10 s; a Quartz-style "
        "seconds-first '*/20 * * * * *' is refused)."))
    run_after: RunAfter | None = None

    @model_validator(mode="after")
    def _check_schedule(self) -> "DataLoadSpec":
        if self.policy == "OnEvent" and any(t.trace is not None for t in self.target):
            raise FieldProblems([(("target",), (
                "a trace target is a fixed set of files, no sync event changes it: use policy Once or Cron"))])
        check_schedule(self.policy, self.schedule)
        return self


def check_schedule(policy: str, schedule: str | None) -> None:
    """Raise :class:`FieldProblems` at ``schedule`` unless it is a valid cron schedule given with
    policy ``Cron``, or absent with any other policy."""
    if policy == "Cron":
        if schedule is None:
            raise FieldProblems([(("schedule",), (
                "missing required field: policy Cron needs a cron schedule, e.g. '0 3 * * *'"
            ))])
        try:
            _check_cron(schedule)
        except ValueError as err:
            raise FieldProblems([(("schedule",), str(err))]) from None
    elif schedule is not None:
        raise FieldProblems([(("schedule",), (
            f"a schedule is only used with policy Cron (policy is {policy}): "
            "remove it or set policy: Cron"
        ))])


class TargetStatus(_Model):
    """Progress of one DataLoad target: files and bytes found, bytes cached, failures; while the
    load is Executing, ``files_done``/``bytes_done`` (bytes) so far."""

    path: str
    files: int = 0
    bytes: int = 0
    cached_bytes: int = 0
    files_done: int | None = None
    bytes_done: int | None = None
    phase: Literal["Pending", "Executing", "Complete", "Failed", "Cancelled"] = "Pending"
    failures: list[str] = Field(default_factory=list)


class DataLoadStatus(_Model):
    """``DataLoad.status``, written by the control plane (times RFC 3339, duration as text)."""

    phase: Literal["Pending", "Executing", "Complete", "Failed", "Cancelled"] = "Pending"
    duration: str | None = None
    conditions: list[Condition] = Field(default_factory=list)
    targets: list[TargetStatus] = Field(default_factory=list)
    last_schedule_time: Timestamp | None = None
    last_successful_time: Timestamp | None = None
    completion_time: Timestamp | None = None  # set when a runAfter predecessor's failure ended it
    workers: dict[str, dict[str, int]] = Field(default_factory=dict)
    """Per cache worker (distributed runtimes): ``{"blocks", "bytes"}`` it stored for this load."""
    progress: dict[str, int] = Field(default_factory=dict)
    """While Executing: ``filesDone``, ``filesTotal``, ``bytesDone``, ``bytesTotal`` (bytes)."""


class DataLoad(_Model):
    """A warmup job: load a Dataset's targets into its runtime's cache."""

    api_version: Literal["datacache.io/v1alpha1"] = API_VERSION
    kind: Literal["DataLoad"] = "DataLoad"
    metadata: ObjectMeta
    spec: DataLoadSpec
    status: DataLoadStatus | None = None


def describe(value: Any) -> str:
    """Describe a YAML value for an error message: ``'abc'``, ``42``, ``true``, ``a list``, ``null``."""
    if value is None:
        return "null (an empty value)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__
