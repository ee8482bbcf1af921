"""Resource models of data flows: DataMigrate and DataProcess (Fluid's names and fields).

A **DataMigrate** copies files between a Dataset (or a sub-path of it) and an external fsspec URL,
in either direction (``from``/``to``: exactly one side a ``dataset``, the other
``externalStorage``), once or on a cron schedule. A **DataProcess** runs a command against a
Dataset mounted read-only at ``mountPath``. Both, and DataLoad, may wait for another operation
with ``runAfter`` (:class:`datacache.api.models.RunAfter`), which chains them into a flow.

Credentials of an external store come only from secret refs (``encryptOptions``), as for a
Dataset's mounts. Units: bytes, seconds.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from .models import (
    API_VERSION,
    Condition,
    DnsLabel,
    EncryptOption,
    FieldProblems,
    Mount,
    ObjectMeta,
    PlainOptions,
    RunAfter,
    Timestamp,
    _check_namespace_path,
    _Model,
    argv_only,
    check_schedule,
)

__all__ = [
    "DatasetRef",
    "DatasetPath",
    "ExternalStorage",
    "MigrateEndpoint",
    "DataMigrateSpec",
    "StepStatus",
    "DataMigrateStatus",
    "DataMigrate",
    "EnvVar",
    "DataProcessSpec",
    "DataProcessStatus",
    "DataProcess",
    "FLOW_KINDS",
]

FLOW_KINDS = ("DataLoad", "DataMigrate", "DataProcess")
"""The kinds that may take part in a flow (``runAfter``)."""

Phase = Literal["Pending", "Executing", "Complete", "Failed", "Cancelled"]


class DatasetRef(_Model):
    """A Dataset, in the namespace of the resource naming it unless ``namespace`` is given."""

    name: DnsLabel
    namespace: DnsLabel | None = None


class DatasetPath(DatasetRef):
    """A Dataset and a path in its namespace (``/`` = all of it)."""

    path: str = "/"

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        _check_namespace_path(value, "path")
        return value


class ExternalStorage(_Model):
    """A store outside any Dataset: ``uri`` (``scheme://...`` or an absolute local path),
    fsspec ``options`` (plain values only) and ``encryptOptions`` (secret refs, never inline)."""

    uri: str
    options: PlainOptions = Field(default_factory=dict)
    encrypt_options: list[EncryptOption] = Field(default_factory=list)

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, value: str) -> str:
        return Mount._check_mount_point(value)

    def as_mount(self) -> Mount:
        """This store as a :class:`Mount`, so that the mounts' credential lookup opens it."""
        return Mount(name="external", mount_point=self.uri, options=self.options,
                     encrypt_options=self.encrypt_options)


class MigrateEndpoint(_Model):
    """One side of a DataMigrate: exactly one of ``dataset`` or ``externalStorage``."""

    dataset: DatasetPath | None = None
    external_storage: ExternalStorage | None = None

    @model_validator(mode="after")
    def _one(self) -> "MigrateEndpoint":
        if (self.dataset is None) == (self.external_storage is None):
            raise FieldProblems([((), "set exactly one of dataset {name, path} or externalStorage {uri}")])
        return self


class DataMigrateSpec(_Model):
    """``DataMigrate.spec``.

    ``from``/``to``: one side a Dataset (its path maps onto the mount holding it; copying into a
    Dataset writes to that mount's UFS, then syncs the Dataset), the other an external store.
    ``policy``: ``Once`` (at apply, or when ``runAfter`` completes) or ``Cron`` on ``schedule``
    (5 fields, or 6 with seconds last). ``parallelism``: files copied at once (1-64).
    ``overwrite``: replace a destination file that differs and is newer than its source (default:
    keep it, and say so in ``status.skipped``). ``ttlSecondsAfterFinished``: delete the resource
    that long after it finished (seconds; None: keep it).
    """

    from_: MigrateEndpoint = Field(alias="from")
    to: MigrateEndpoint
    policy: Literal["Once", "Cron"] = "Once"
    schedule: str | None = None
    parallelism: Annotated[int, Field(ge=1, le=64)] = 4
    overwrite: bool = False
    ttl_seconds_after_finished: Annotated[int, Field(ge=0)] | None = None
    run_after: RunAfter | None = None

    @model_validator(mode="after")
    def _check(self) -> "DataMigrateSpec":
        check_schedule(self.policy, self.schedule)
        if (self.from_.dataset is None) == (self.to.dataset is None):
            raise FieldProblems([(("to",), (
                "one side must be a dataset and the other externalStorage (copies go between a Dataset "
                "and an external store, either way)"))])
        return self

    @property
    def dataset_side(self) -> DatasetPath:
        """The Dataset end of the copy."""
        return self.from_.dataset or self.to.dataset  # type: ignore[return-value]

    @property
    def into_dataset(self) -> bool:
        """Whether the copy writes into the Dataset (then the Dataset is synced after it)."""
        return self.to.dataset is not None


class StepStatus(_Model):
    """What every flow step's status holds: ``phase``, ``duration`` (text, seconds), a
    ``Complete`` condition saying why it failed or waits, and times (RFC 3339)."""

    phase: Phase = "Pending"
    duration: str | None = None
    conditions: list[Condition] = Field(default_factory=list)
    last_schedule_time: Timestamp | None = None
    last_successful_time: Timestamp | None = None
    completion_time: Timestamp | None = None
    runner_pid: int | None = None  # embedded: the process running it, while Executing


class DataMigrateStatus(StepStatus):
    """``DataMigrate.status``. ``progress``: ``filesDone``, ``filesSkipped`` (already equal at
    the destination), ``filesTotal``, ``bytesDone``, ``bytesTotal`` (bytes), ``bytesPerSecond``,
    ``etaSeconds``; ``failures``: per file ``{path, message}``; ``skipped``: destination files kept
    because they are newer (``overwrite: false``)."""

    progress: dict[str, float] = Field(default_factory=dict)
    failures: list[dict[str, str]] = Field(default_factory=list)
    skipped: list[dict[str, str]] = Field(default_factory=list)


class DataMigrate(_Model):
    """Copy data between a Dataset and an external store."""

    api_version: Literal["datacache.io/v1alpha1"] = API_VERSION
    kind: Literal["DataMigrate"] = "DataMigrate"
    metadata: ObjectMeta
    spec: DataMigrateSpec
    status: DataMigrateStatus | None = None


class EnvVar(_Model):
    """An environment variable of a DataProcess's command (a plain value: secrets go in the
    external store's encryptOptions, never here)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    value: str = ""


class DataProcessSpec(_Model):
    """``DataProcess.spec``: run ``command`` + ``args`` (an argv list, never a shell string) with
    ``dataset`` mounted read-only at ``mountPath`` (``DATACACHE_DATASET_PATH`` in its environment,
    with ``env``). Embedded, it is a local process and its own FUSE mount; on Kubernetes, a Job
    (``image``, default datacache's) whose pod gets the dataset's FUSE sidecar.
    ``timeoutSeconds`` bounds the run (None: no bound); ``logLines``: the log's last lines kept in
    status.
    """

    dataset: DatasetRef
    mount_path: str
    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    args: list[str] = Field(default_factory=list)
    env: list[EnvVar] = Field(default_factory=list)
    image: str | None = None
    timeout_seconds: Annotated[float, Field(gt=0)] | None = None
    log_lines: Annotated[int, Field(ge=0, le=1000)] = 20
    ttl_seconds_after_finished: Annotated[int, Field(ge=0)] | None = None
    run_after: RunAfter | None = None

    @field_validator("mount_path")
    @classmethod
    def _check_mount_path(cls, value: str) -> str:
        _check_namespace_path(value, "mountPath")
        if value == "/":
            raise ValueError("mountPath '/' would hide the whole filesystem: name a directory, e.g. /data")
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _argv_only(cls, value: Any) -> Any:
        return argv_only(value)

    @model_validator(mode="after")
    def _no_reserved_env(self) -> "DataProcessSpec":
        for i, var in enumerate(self.env):
            if var.name == "DATACACHE_DATASET_PATH":
                raise FieldProblems([(("env", i, "name"), (
                    "DATACACHE_DATASET_PATH is set from mountPath: remove it from env"))])
        return self


class DataProcessStatus(StepStatus):
    """``DataProcess.status``: ``exitCode``, ``duration`` (text, seconds), ``logTail`` (the
    command's last output lines), and where the whole log is (``logFile``, embedded only)."""

    exit_code: int | None = None
    log_tail: list[str] = Field(default_factory=list)
    log_file: str | None = None


class DataProcess(_Model):
    """Run a command against a mounted Dataset."""

    api_version: Literal["datacache.io/v1alpha1"] = API_VERSION
    kind: Literal["DataProcess"] = "DataProcess"
    metadata: ObjectMeta
    spec: DataProcessSpec
    status: DataProcessStatus | None = None
