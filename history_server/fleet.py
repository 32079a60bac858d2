"""The fleet's history server: one server at the hub, every member cluster's TrainJobs, each cluster's own
API server deciding who reads what of it.

Why each cluster decides for itself: RBAC, users and tokens are a cluster's own. A ServiceAccount token is
signed by the cluster that issued it, a RoleBinding grants rights in that cluster only, and namespace ``x``
of cluster A has nothing to do with namespace ``x`` of cluster B. So a request about cluster C asks C's
API server, and only C's: a TokenReview there says who the token belongs to (a token C does not accept
gets a 401 for anything of C, whatever another cluster says of it), and a SubjectAccessReview there says
whether that user may ``list`` or ``get`` TrainJobs in the namespace. Each cluster has its own reviewer
credential (``--fleet-clusters``), which needs to create TokenReviews and SubjectAccessReviews there and
nothing else, and its own cache of answers, so an answer of one cluster is never reused for another.

Why a token goes to the clusters the request names, and no further: a member's API server sees every
token it is asked to review, so a token for cluster A is sent to A alone (the cluster is in every path),
and the fleet-wide list asks only the clusters named in its ``cluster`` parameters (every cluster of the
fleet when none is named, for a token all of them accept, as an OIDC token may be).

Why one index per cluster: the hub keeps each member's records in fleet streams of that member's own
(``contracts.fleet.fleet_stream``), under ``fleet.<cluster>.<the member's subject>``; the index reads only the
streams of the clusters it is configured for, and folds each record into its cluster's own
``HistoryIndex`` with the subject the member gave it, so the per-namespace reads, the pruning and the
states are exactly the single-cluster server's, and no summary can be filed under another cluster. Records
of a cluster the server is not configured for are not read: nobody could be authorized for them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from contracts import fleet, streams, subjects
from history_server.index import READ_PAGE, HistoryIndex
from plumbing.kube import CredentialSource, KubeConfig
from tjpipe.settings import SettingsError

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from plumbing.bus_history import StoredMessage

FLEET_CLUSTERS_SETTING = "--fleet-clusters / TJPIPE_HISTORY_FLEET_CLUSTERS"


# ------------------------------------------------------------------------------------------- the file


class _ClusterEntry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    name: str
    kubeconfig: str = ""
    context: str = ""
    server: str = ""
    certificate_authority: str = ""
    token_file: str = ""


class _FleetFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    clusters: list[_ClusterEntry]


@dataclass(frozen=True)
class MemberCluster:
    """One member cluster as the server reaches its API server, with its reviewer credential."""

    name: str
    kubeconfig: str = ""
    """A kubeconfig whose (``context``'s) server, CA and user are the cluster's and the reviewer's."""
    context: str = ""
    server: str = ""
    certificate_authority: str = ""
    token_file: str = ""
    """The reviewer's bearer token, read again whenever the file changes (a projected token rotates)."""

    def credentials(self) -> CredentialSource:
        if self.kubeconfig:
            return CredentialSource(self.kubeconfig, context=self.context or None)
        return _TokenFileSource(self.server, self.certificate_authority, Path(self.token_file))


class _TokenFileSource(CredentialSource):
    """An API server's address, its CA and a token file, without a kubeconfig around them."""

    def __init__(self, server: str, ca_file: str, token_file: Path) -> None:
        super().__init__(None)
        self._server, self._ca_file, self._path = server.rstrip("/"), ca_file, token_file

    def _load_plain(self) -> tuple[KubeConfig, Path | None] | None:
        token = self._path.read_text().strip()
        return KubeConfig(server=self._server, token=token or None, ca_file=self._ca_file, source=self), self._path


def load_fleet_clusters(path: str) -> tuple[MemberCluster, ...]:
    """The member clusters ``path`` names (YAML), checked: names are cluster names, each once, and each has
    either a kubeconfig or a server, its CA and a token file, all readable. Relative paths are from the
    file's folder."""
    import yaml

    where = Path(path)
    try:
        doc = yaml.safe_load(where.read_text())
        parsed = msgspec.convert(doc, _FleetFile)
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{FLEET_CLUSTERS_SETTING}: cannot read {path}: {exc}") from None
    except (yaml.YAMLError, msgspec.ValidationError) as exc:
        raise SettingsError(f"{FLEET_CLUSTERS_SETTING}: {path}: {exc}") from None

    def file(value: str, what: str, name: str) -> str:
        full = where.parent / value
        if not full.is_file():
            raise SettingsError(f"{FLEET_CLUSTERS_SETTING}: cluster {name!r}: {what} {full} is not a file")
        return str(full)

    out: list[MemberCluster] = []
    for entry in parsed.clusters:
        try:
            fleet.check_cluster_name(entry.name)
        except fleet.FleetNameError as exc:
            raise SettingsError(f"{FLEET_CLUSTERS_SETTING}: {exc}") from None
        if any(c.name == entry.name for c in out):
            raise SettingsError(f"{FLEET_CLUSTERS_SETTING}: cluster {entry.name!r} is named twice")
        if entry.kubeconfig:
            if entry.server or entry.certificate_authority or entry.token_file:
                raise SettingsError(
                    f"{FLEET_CLUSTERS_SETTING}: cluster {entry.name!r}: give a kubeconfig, or a server with its "
                    "certificateAuthority and tokenFile, not both"
                )
            out.append(
                MemberCluster(
                    name=entry.name,
                    kubeconfig=file(entry.kubeconfig, "kubeconfig", entry.name),
                    context=entry.context,
                )
            )
            continue
        if not (entry.server.startswith("https://") and entry.certificate_authority and entry.token_file):
            raise SettingsError(
                f"{FLEET_CLUSTERS_SETTING}: cluster {entry.name!r}: needs a kubeconfig, or server "
                "(https://...), certificateAuthority and tokenFile"
            )
        out.append(
            MemberCluster(
                name=entry.name,
                server=entry.server,
                certificate_authority=file(entry.certificate_authority, "certificateAuthority", entry.name),
                token_file=file(entry.token_file, "tokenFile", entry.name),
            )
        )
    if not out:
        raise SettingsError(f"{FLEET_CLUSTERS_SETTING}: {path} names no cluster")
    return tuple(out)


# ------------------------------------------------------------------------------------------- the index


_FOLDS = (
    (streams.EVENTS_HISTORY, subjects.events_filter(), "add_event"),
    (streams.DLQ, f"{subjects.DLQ_PREFIX}.>", "add_dead_letter"),
    (streams.PROGRESS, f"{subjects.PROGRESS_PREFIX}.>", "add_progress"),
)


class FleetIndex:
    """One ``HistoryIndex`` per configured cluster, folded from the hub's fleet streams in stream order."""

    def __init__(self, clusters: tuple[str, ...]) -> None:
        self.clusters = {name: HistoryIndex() for name in clusters}
        self.next_seq: dict[str, int] = {}
        self.foreign = 0
        """Records of clusters this server is not configured for: not indexed."""
        self.reset()

    def reset(self) -> None:
        for index in self.clusters.values():
            index.reset()
        self.next_seq = {
            fleet.fleet_stream(spec.name, cluster): 1 for spec, _, _ in _FOLDS for cluster in self.clusters
        }

    def __len__(self) -> int:
        return sum(len(index) for index in self.clusters.values())

    def fold(self, stored: StoredMessage, origin: str, method: str) -> None:
        cluster, original = fleet.cluster_of(stored.subject)
        index = self.clusters.get(cluster)
        if index is None:
            self.foreign += 1
            return
        getattr(index, method)(dataclasses.replace(stored, stream=origin, subject=original))

    async def catch_up(self, js: JetStreamContext) -> int:
        """Fold in everything that arrived at the hub since the last call; how many messages."""
        import nats.js.errors

        from plumbing.bus_history import read_stream

        # Each member's copies are in streams of its own (contracts.fleet.fleet_stream).
        firsts: dict[str, int] = {}
        folds: list[tuple[str, str, str, str]] = []
        for cluster in self.clusters:
            for spec, origin_filter, method in _FOLDS:
                name = fleet.fleet_stream(spec.name, cluster)
                try:
                    info = await js.stream_info(name)
                except nats.js.errors.NotFoundError:
                    if spec is not streams.PROGRESS:
                        raise
                    continue
                firsts[name] = int(info.state.first_seq or 0)
                if int(info.state.last_seq or 0) + 1 < self.next_seq[name]:
                    self.reset()  # purged or made anew below our position: start over, so nothing counts twice
                folds.append((name, fleet.fleet_subject(cluster, origin_filter), spec.name, method))
        read = 0
        for name, subject, origin, method in folds:
            while True:
                page = await read_stream(js, name, subject, start_seq=self.next_seq[name], limit=READ_PAGE)
                for stored in page:
                    self.fold(stored, origin, method)
                read += len(page)
                if not page:
                    break
                self.next_seq[name] = page[-1].seq + 1
                if len(page) < READ_PAGE:
                    break
        for cluster, index in self.clusters.items():
            index.prune(
                firsts[fleet.fleet_stream(streams.EVENTS_HISTORY.name, cluster)],
                firsts[fleet.fleet_stream(streams.DLQ.name, cluster)],
                firsts.get(fleet.fleet_stream(streams.PROGRESS.name, cluster)),
            )
        return read

    def counts(self) -> dict[str, Any]:
        return {name: index.counts() for name, index in self.clusters.items()}
