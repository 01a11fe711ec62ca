"""The worker's topics: what it needs, what the cluster holds, creating what is missing.

Everything is decided before anything is created. ``plan_topics`` compares the
topics the worker needs with what the cluster holds, and a start where one
existing topic has a partition count the worker cannot use is refused whole:
creating the missing topics first and refusing afterwards left a new topic of the
asked-for count beside an old one of another, and no flag that fits both
(issue 24.2).

New topics get the cluster's ``default.replication.factor`` unless the worker was
told a replication factor: a cluster run at replication factor 3 keeps the
worker's input and state through the loss of a broker's disk, which the
replication factor 1 of the past did not (issue 21.1).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from ..core.layout import changelog_topics
from ..errors import SpecmeterError
from ..settings import WorkerSettings, partials_topic_of

__all__ = [
    "ClusterView",
    "PartialsShared",
    "TopicMismatch",
    "TopicPlan",
    "TopicProblem",
    "TopicShape",
    "TopicSpec",
    "TopicsNotCreated",
    "create_topic",
    "check_partials_not_shared",
    "cleanup_warning",
    "deletes_by_retention",
    "describe_cluster",
    "ensure_topics",
    "existing_partitions",
    "plan_topics",
    "replication_warning",
    "topic_configs",
    "worker_topics",
]

log = logging.getLogger("specmeter.topics")

#: replicas a production topic wants at most (RF 3 with min.insync.replicas=2
#: survives one broker lost while writes go on); fewer brokers, fewer replicas
WANTED_REPLICAS = 3

#: Kafka's CreateTopics value for "the broker's default.replication.factor"
CLUSTER_DEFAULT = -1


class TopicProblem(SpecmeterError, RuntimeError):
    """The worker's topics cannot be used or made; ``fix`` says what to do (one line)."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        super().__init__(problem)
        self.fix = fix


class TopicSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One topic the worker needs.

    Attributes:
        name: the topic.
        partitions: what the worker creates it with.
        matched: its partition count must be the worker's ``--partitions`` (the
            records topic and every topic keyed like it).
        compacted: it must keep the newest message of every key for good
            (``cleanup.policy=compact``): the state changelogs, and the metrics topic
            (the newest revision of every batch of every run).
        written: the worker produces to it (it then takes the worker's largest message).
        state: a state changelog (the worker refuses one that deletes by retention).
        named_by: the flag that gives the worker another one.
    """

    name: str
    partitions: int
    matched: bool
    compacted: bool = False
    written: bool = True
    named_by: str
    state: bool = False


class TopicShape(msgspec.Struct, frozen=True):
    """An existing topic: its partitions and the fewest replicas any of them has."""

    partitions: int
    replicas: int


class ClusterView(msgspec.Struct, frozen=True):
    """What one metadata request said: the live brokers (node id: host:port) and the
    asked-for topics that exist."""

    brokers: dict[int, str]
    topics: dict[str, TopicShape]
    #: the asked-for topics with a partition that has no leader now (just created, or a
    #: broker away): a consumer asking their offsets now is refused
    leaderless: frozenset[str] = frozenset()

    def shapes_of(self, specs: Iterable[TopicSpec]) -> list[tuple[TopicSpec, TopicShape]]:
        """Each of ``specs`` whose topic exists, with its shape."""
        return [(s, self.topics[s.name]) for s in specs if s.name in self.topics]


class TopicPlan(msgspec.Struct, frozen=True):
    """What starting the worker would do: the topics to create, and the existing
    ones whose partition count is not ``partitions`` (the start is refused then)."""

    partitions: int
    create: tuple[TopicSpec, ...]
    mismatched: dict[str, int]
    #: partition counts of the existing topics that must match, by topic
    matched_counts: dict[str, int]

    @property
    def agreed(self) -> int | None:
        """The one partition count every existing matched topic has, if they agree."""
        counts = set(self.matched_counts.values())
        return counts.pop() if len(counts) == 1 else None


class TopicMismatch(TopicProblem):
    """Existing topics have a partition count the worker cannot use; nothing was created."""

    def __init__(self, plan: TopicPlan, specs: Sequence[TopicSpec]) -> None:
        want = plan.partitions
        named = " and ".join(_have(names, n) for n, names in _by_count(plan.mismatched).items())
        flags = sorted({s.named_by for s in specs if s.name in plan.mismatched})
        own = f"give this worker topics of its own ({', '.join(flags)})"
        super().__init__(
            f"the worker runs with --partitions {want} but {named} (nothing was created)", _mismatch_fix(plan, own)
        )
        self.plan = plan


def _mismatch_fix(plan: TopicPlan, own: str) -> str:
    """What to do about a mismatch: start with the partition count the existing topics
    agree on, or (when they do not agree) delete some; either way, or use topics of its
    own (``own`` says how)."""
    agreed = plan.agreed
    if agreed is not None:
        return (
            f"start it with --partitions {agreed} (env SPECMETER_WORKER_PARTITIONS={agreed}), or {own}: "
            "a topic's partition count is fixed, and the state topics must match it"
        )
    counts = ", ".join(f"{name}: {n}" for name, n in plan.matched_counts.items())
    return (
        f"no --partitions fits them all ({counts}): delete the topics whose data may go "
        f"(kafka-topics.sh --delete), or {own}"
    )


def _by_count(partitions: dict[str, int]) -> dict[int, list[str]]:
    grouped: dict[int, list[str]] = {}
    for name, n in partitions.items():
        grouped.setdefault(n, []).append(name)
    return grouped


def _have(names: list[str], n: int) -> str:
    if len(names) == 1:
        return f"topic {names[0]!r} has {n} partitions"
    quoted = [repr(name) for name in names]
    return f"topics {', '.join(quoted[:-1])} and {quoted[-1]} have {n} partitions"


class TopicsNotCreated(TopicProblem):
    """The cluster refused to create a topic the worker needs."""


class ChangelogDeletes(TopicProblem):
    """A state changelog deletes messages by retention: past it, takeover records go while
    their owners' records stay, those stop counting, and a restore loses state
    (``docs/ownership.md``). The worker refuses to start on it."""

    def __init__(self, names: Sequence[str], configs: dict[str, dict[str, str]]) -> None:
        shown = ", ".join(f"{name} (cleanup.policy={configs[name].get('cleanup.policy', '?')})" for name in names)
        super().__init__(
            f"the state changelog(s) {shown} delete messages by retention: a restore would lose state",
            "set cleanup.policy=compact on each (kafka-configs.sh --bootstrap-server HOST:PORT --alter "
            "--entity-type topics --entity-name NAME --add-config cleanup.policy=compact; docs/operations.md)",
        )


class PartialsShared(TopicProblem):
    """Another deployment's stage 2 reads the partials topic this one would write: each
    would merge and republish the other's batches (docs/operations.md, Deployments)."""

    def __init__(self, topic: str, app_ids: Sequence[str], own: str) -> None:
        super().__init__(
            f"the partials topic {topic!r} is already read by the deployment(s) {', '.join(map(repr, app_ids))} "
            f"(consumer group <app-id>-stage2): two deployments must not share it",
            f"drop --partials-topic (app id {own!r} then writes {partials_topic_of(own)!r}) or name one no other "
            "deployment uses",
        )


async def check_partials_not_shared(admin: Any, settings: WorkerSettings) -> None:
    """Refuse a partials topic on which another app id's stage-2 group committed offsets.

    Raises:
        PartialsShared: naming the other deployments.
    """
    from aiokafka.errors import KafkaError

    try:
        readers = await _other_stage2_readers(admin, settings.consumer_groups[1], settings.topics.partials)
    except KafkaError as exc:  # not allowed to describe groups: nothing to check with
        log.info("could not check which deployments read %s: %r", settings.topics.partials, exc)
        return
    if readers:
        raise PartialsShared(settings.topics.partials, [g.removesuffix("-stage2") for g in readers], settings.app_id)


async def _other_stage2_readers(admin: Any, own: str, topic: str) -> list[str]:
    """The stage-2 consumer groups other than ``own`` that committed offsets on ``topic``
    (what the check refuses; asking may raise a KafkaError, which the check forgives)."""
    others = [g for g, *_ in await admin.list_consumer_groups() if g.endswith("-stage2") and g != own]
    # all at once: one round trip, not two per deployment on the cluster (its start-up's cost)
    reads = await asyncio.gather(*(_reads(admin, g, topic) for g in others), return_exceptions=True)
    failed = next((r for r in reads if isinstance(r, BaseException)), None)
    if failed is not None:
        raise failed
    return [g for g, read in zip(others, reads, strict=True) if read]


async def _reads(admin: Any, group: str, topic: str) -> bool:
    """Whether ``group`` has committed offsets on ``topic``."""
    offsets = await admin.list_consumer_group_offsets(group)
    return any(tp.topic == topic for tp in offsets)


def worker_topics(settings: WorkerSettings) -> list[TopicSpec]:
    """Every topic a worker of ``settings`` reads or writes, state topics first."""
    t = settings.topics
    n = settings.partitions
    stage1_log, stage2_log = changelog_topics(settings.app_id)
    return [
        TopicSpec(name=stage1_log, partitions=n, matched=True, compacted=True, named_by="--app-id", state=True),
        TopicSpec(name=stage2_log, partitions=n, matched=True, compacted=True, named_by="--app-id", state=True),
        TopicSpec(name=t.records, partitions=n, matched=True, written=False, named_by="--records-topic"),
        TopicSpec(name=t.partials, partitions=n, matched=True, named_by="--partials-topic"),
        # compacted on (run_id, batch_id): the newest revision of every batch outlives time
        # retention, so a reader from the beginning gets the whole run (issue 33)
        TopicSpec(name=t.metrics, partitions=1, matched=False, compacted=True, named_by="--metrics-topic"),
        TopicSpec(name=t.deadletter, partitions=1, matched=False, named_by="--deadletter-topic"),
    ]


def plan_topics(specs: Sequence[TopicSpec], view: ClusterView, partitions: int) -> TopicPlan:
    """Compare what the worker needs with what exists (pure: no broker)."""
    matched_counts = {s.name: shape.partitions for s, shape in view.shapes_of(specs) if s.matched}
    return TopicPlan(
        partitions=partitions,
        create=tuple(s for s in specs if s.name not in view.topics),
        mismatched={name: n for name, n in matched_counts.items() if n != partitions},
        matched_counts=matched_counts,
    )


def replication_warning(view: ClusterView, specs: Sequence[TopicSpec]) -> str | None:
    """One line when a topic of ``specs`` has fewer replicas than the cluster has
    brokers (up to ``WANTED_REPLICAS``); None when every one has enough."""
    target = min(len(view.brokers), WANTED_REPLICAS)
    thin = [(s.name, shape.replicas) for s, shape in view.shapes_of(specs) if shape.replicas < target]
    if not thin:
        return None
    listed = ", ".join(f"{name} ({r})" for name, r in thin)
    return (
        f"{len(thin)} of the worker's topics have fewer replicas than the cluster's {len(view.brokers)} brokers: "
        f"{listed}; a broker that loses its disk takes their data (input and state) with it: give them "
        f"{target} replicas (kafka-reassign-partitions.sh; docs/operations.md)"
    )


#: the settings that say whether a topic deletes messages by time or size
CLEANUP_CONFIGS = ("cleanup.policy", "retention.ms", "retention.bytes")


def deletes_by_retention(configs: dict[str, str]) -> bool:
    """Whether a topic with these settings deletes messages by time or size: without
    ``compact`` in its cleanup.policy always; with ``compact,delete`` unless both
    retention.ms and retention.bytes are -1 (pure)."""
    policy = {p.strip() for p in configs.get("cleanup.policy", "delete").split(",")}
    if "compact" not in policy:
        return True
    return "delete" in policy and (configs.get("retention.ms") != "-1" or configs.get("retention.bytes") != "-1")


def _deleting_by_retention(specs: Sequence[TopicSpec], configs: dict[str, dict[str, str]]) -> list[str]:
    """The names of those of ``specs`` that exist (have ``configs``) and delete messages by
    retention: what the changelog check refuses and the warning names."""
    return [s.name for s in specs if s.name in configs and deletes_by_retention(configs[s.name])]


def cleanup_warning(specs: Sequence[TopicSpec], configs: dict[str, dict[str, str]]) -> str | None:
    """One line when an existing topic the worker keeps compacted deletes by retention
    (``configs``: each existing topic's ``CLEANUP_CONFIGS``); None when none does."""
    wrong = _deleting_by_retention([s for s in specs if s.compacted], configs)
    if not wrong:
        return None

    def shown(name: str) -> str:
        c = configs[name]
        return f"{name} (cleanup.policy={c.get('cleanup.policy', '?')}, retention.ms={c.get('retention.ms', '?')})"

    return (
        f"{len(wrong)} of the worker's topics delete messages by retention where they must keep the newest "
        f"message of every key for good: {', '.join(map(shown, wrong))}; past retention a worker that restores "
        "its state, or a reader of the metrics topic from the beginning (consume_metrics(from_beginning=True), "
        "tail --from-beginning), gets less than the run: set cleanup.policy=compact on each "
        "(kafka-configs.sh --bootstrap-server HOST:PORT --alter --entity-type topics --entity-name NAME "
        "--add-config cleanup.policy=compact; docs/operations.md)"
    )


async def topic_configs(admin: Any, names: Sequence[str], keys: Sequence[str]) -> dict[str, dict[str, str]]:
    """``keys`` of each of ``names`` (existing topics), as the cluster describes them.

    Raises:
        TopicProblem: the cluster refused to describe one (e.g. no DescribeConfigs right).
    """
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    if not names:
        return {}
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, name, dict.fromkeys(keys)) for name in names]
    )
    return _configs_of(responses, keys)


def _configs_of(responses: Any, keys: Sequence[str]) -> dict[str, dict[str, str]]:
    """``keys`` of each topic the DescribeConfigs responses describe; a refusal raises."""
    from aiokafka.errors import for_code

    out: dict[str, dict[str, str]] = {}
    for response in responses:
        for code, message, _, name, entries in response.resources:
            if code:
                raise TopicProblem(f"describing topic {name!r} failed: {for_code(code).__name__} ({message})")
            out[name] = {entry[0]: entry[1] for entry in entries if entry[0] in keys}
    return out


async def describe_cluster(admin: Any, names: Iterable[str]) -> ClusterView:
    """The live brokers, and the shape of each of ``names`` that exists, asked for those names alone.

    ``list_topics`` fetches the metadata of every topic of the cluster, decoded in
    Python: on a broker holding a few thousand topics that took a worker's start-up
    0.3 s per call. The metadata request for named topics must not create them
    (``auto.create.topics.enable`` would, with the broker's default partition
    count), which aiokafka's ``describe_topics`` does not ask for
    (``delivery.internals.metadata_without_auto_create``; ``tests/test_stream_app.py`` checks
    it against a real broker).
    """
    from ..delivery.internals import metadata_without_auto_create

    # an empty list asks for no topic (None would ask for all): the brokers alone
    answer = await metadata_without_auto_create(admin, names)
    return ClusterView(
        brokers={b["node_id"]: f"{b['host']}:{b['port']}" for b in answer["brokers"]},
        topics=_shapes(answer["topics"]),
        leaderless=frozenset(t["topic"] for t in answer["topics"] if any(p["leader"] < 0 for p in t["partitions"])),
    )


def _shapes(topics: list[dict[str, Any]]) -> dict[str, TopicShape]:
    """The shape of each topic of a metadata answer that exists (no error, some
    partitions): its partition count and the fewest replicas any partition has."""
    return {
        t["topic"]: TopicShape(len(t["partitions"]), min(len(p["replicas"]) for p in t["partitions"]))
        for t in topics
        if t.get("error_code", 0) == 0 and t["partitions"]
    }


#: the metadata error of a topic the principal may not describe
TOPIC_AUTHORIZATION_FAILED = 29


async def unauthorized_topics(admin: Any, names: Iterable[str]) -> set[str]:
    """Those of ``names`` that the principal may not describe: absent from ``list_topics``
    like a missing topic, but there (creates nothing)."""
    from ..delivery.internals import metadata_without_auto_create

    answer = await metadata_without_auto_create(admin, names)
    return {t["topic"] for t in answer["topics"] if t.get("error_code", 0) == TOPIC_AUTHORIZATION_FAILED}


async def existing_partitions(admin: Any, names: Iterable[str]) -> dict[str, int]:
    """Partitions of each of ``names`` that exists (``describe_cluster``; creates nothing)."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    view = await describe_cluster(admin, wanted)
    return {name: shape.partitions for name, shape in view.topics.items()}


def _new_topic(spec: TopicSpec, replication_factor: int | None, max_message_bytes: int) -> Any:
    from aiokafka.admin import NewTopic

    configs = {"cleanup.policy": "compact" if spec.compacted else "delete"}
    if spec.written:
        # what the worker's producer may send in one request: a chunk's state delta,
        # or a BatchMetrics with 64 weight versions' full histograms, can pass the
        # broker's 1 MiB default
        configs["max.message.bytes"] = str(2 * max(max_message_bytes, 1_048_576))
    if replication_factor is None:
        # CreateTopics sends -1 for "the broker's default.replication.factor" (brokers
        # >= 2.4 take it at every request version aiokafka speaks); aiokafka's NewTopic
        # accepts -1 only beside a replica assignment, and an empty one is none
        return NewTopic(
            spec.name,
            num_partitions=spec.partitions,
            replication_factor=CLUSTER_DEFAULT,
            replica_assignments={},
            topic_configs=configs,
        )
    return NewTopic(
        spec.name, num_partitions=spec.partitions, replication_factor=replication_factor, topic_configs=configs
    )


def _creation_failure(name: str, code: int, message: str | None) -> TopicsNotCreated:
    from aiokafka.errors import for_code

    error = for_code(code).__name__
    problem = f"the cluster refused to create topic {name!r}: {error}" + (f" ({message})" if message else "")
    fixes = {
        "InvalidReplicationFactorError": "pass --replication-factor N (env SPECMETER_WORKER_REPLICATION_FACTOR) "
        "no larger than the brokers that are up, or start the missing brokers",
        "TopicAuthorizationFailedError": "grant the worker's principal Create on its topics, or have an "
        "administrator create them (docs/operations.md lists them)",
        "ClusterAuthorizationFailedError": "grant the worker's principal Create on its topics, or have an "
        "administrator create them (docs/operations.md lists them)",
        "PolicyViolationError": "the cluster's topic policy refused it: have an administrator create the "
        "worker's topics (docs/operations.md lists them)",
    }
    return TopicsNotCreated(problem, fixes.get(error))


async def _create(admin: Any, specs: Sequence[TopicSpec], settings: WorkerSettings) -> None:
    response = await admin.create_topics(
        [_new_topic(s, settings.replication_factor, settings.max_message_bytes) for s in specs]
    )
    _raise_refusal(response)
    log.info(
        "created topics: %s (replication factor: %s)",
        ", ".join(f"{s.name}({s.partitions})" for s in specs),
        settings.replication_factor or "the cluster's default",
    )


def _raise_refusal(response: Any) -> None:
    """Raise the first topic a CreateTopics response refused (aiokafka returns the
    per-topic errors without raising them); one that exists already is no refusal."""
    for entry in response.to_object()["topic_errors"]:
        code = entry["error_code"]
        if code not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS, another worker was quicker
            raise _creation_failure(entry["topic"], code, entry.get("error_message"))


async def _check_cleanup(admin: Any, existing: Sequence[TopicSpec]) -> None:
    """Refuse a state changelog that deletes by retention (``ChangelogDeletes``); warn (one
    line) when the metrics topic does. A cluster that does not let the worker describe
    them gets an INFO line."""
    configs = await _cleanup_configs(admin, existing)
    if configs is None:
        return
    deleting = _deleting_by_retention([s for s in existing if s.state], configs)
    if deleting:
        raise ChangelogDeletes(deleting, configs)
    warning = cleanup_warning(existing, configs)
    if warning is not None:
        log.warning(warning)


async def _cleanup_configs(admin: Any, existing: Sequence[TopicSpec]) -> dict[str, dict[str, str]] | None:
    """The ``CLEANUP_CONFIGS`` of each of ``existing``; None (said at INFO) where the
    cluster will not describe them: the check is one the worker can start without."""
    try:
        return await topic_configs(admin, [s.name for s in existing], CLEANUP_CONFIGS)
    except Exception as exc:  # noqa: BLE001 - a check the worker can run without
        log.info(
            "could not check the cleanup.policy of the worker's compacted topics (%s): grant the worker's "
            "principal DescribeConfigs on them to have it checked at start (docs/operations.md)",
            exc,
        )
        return None


async def _create_missing(
    admin: Any,
    missing: Sequence[TopicSpec],
    specs: Sequence[TopicSpec],
    settings: WorkerSettings,
    visible_within_s: float,
) -> ClusterView:
    """Create the missing topics, then check them again as the cluster shows them."""
    await _create(admin, missing, settings)
    # what was just created must be visible, with the right shape (another
    # worker may have created one a moment before, with its own count)
    view = await _visible(admin, [s.name for s in specs], visible_within_s, created={s.name for s in missing})
    plan = plan_topics(specs, view, settings.partitions)
    if plan.mismatched:
        raise TopicMismatch(plan, specs)
    return view


async def _visible(admin: Any, names: list[str], within_s: float, *, created: set[str]) -> ClusterView:
    """The cluster once it shows every one of ``names``, those just ``created`` with a
    leader for each partition (or ``within_s`` passed): the worker's consumers ask their
    offsets at once, and a partition without a leader yet fails that, which the worker
    would log as a broker away (it starts before Faust is imported, ``worker.early``)."""
    deadline = asyncio.get_running_loop().time() + within_s
    view, wait_s = await describe_cluster(admin, names), 0.01
    while not _settled(view, names, created) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(wait_s)  # a created topic shows within milliseconds: ask soon, then less often
        view, wait_s = await describe_cluster(admin, names), min(2 * wait_s, 0.2)
    return view


def _settled(view: ClusterView, names: list[str], created: set[str]) -> bool:
    """Whether ``view`` shows every one of ``names``, and a leader for each partition of ``created``."""
    return len(view.topics) == len(names) and not view.leaderless & created


async def ensure_topics(settings: WorkerSettings, *, visible_within_s: float = 10.0) -> ClusterView:
    """Check every topic, then create the missing ones; return the cluster's brokers
    and the shape of every topic of the worker.

    Logs one warning when a topic has fewer replicas than the cluster has brokers
    (up to three), and one when the metrics topic deletes messages by retention.

    Raises:
        TopicMismatch: an existing topic has a partition count the worker cannot
            use; raised before anything is created.
        TopicsNotCreated: the cluster refused to create a missing topic.
        ChangelogDeletes: an existing state changelog deletes messages by retention.
    """
    from aiokafka.admin import AIOKafkaAdminClient

    specs = worker_topics(settings)
    names = [s.name for s in specs]
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.broker, **settings.security.aiokafka_kwargs())
    await admin.start()
    try:
        return await _ensure_with(admin, settings, specs, names, visible_within_s)
    finally:
        await admin.close()


async def _ensure_with(
    admin: Any, settings: WorkerSettings, specs: Sequence[TopicSpec], names: list[str], visible_within_s: float
) -> ClusterView:
    """``ensure_topics``' checks and creation, in their order, on a started admin client
    (which ``ensure_topics`` closes whatever happens here)."""
    view = await describe_cluster(admin, names)
    plan = plan_topics(specs, view, settings.partitions)
    if plan.mismatched:
        raise TopicMismatch(plan, specs)
    await check_partials_not_shared(admin, settings)
    existed = [s for s in specs if s.name in view.topics]
    if plan.create:
        view = await _create_missing(admin, plan.create, specs, settings, visible_within_s)
    await _check_durability(admin, view, specs, existed)
    return view


async def _check_durability(
    admin: Any, view: ClusterView, specs: Sequence[TopicSpec], existed: Sequence[TopicSpec]
) -> None:
    """What keeps the topics' data: enough replicas (a warning when not), and the
    compaction of those that existed before this start (``_check_cleanup``; created ones
    were created compacted)."""
    warning = replication_warning(view, specs)
    if warning is not None:
        log.warning(warning)
    await _check_cleanup(admin, [s for s in existed if s.compacted])


async def create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    *,
    replication_factor: int = 1,
    kafka: dict | None = None,
    topic_configs: dict[str, str] | None = None,
) -> None:
    """Create one topic (for tools, tests and benchmarks; the worker uses ``ensure_topics``).

    ``topic_configs``: Kafka topic settings, e.g. ``{"message.timestamp.type": "LogAppendTime"}``.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(kafka or {}))
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(
                    name,
                    num_partitions=partitions,
                    replication_factor=replication_factor,
                    topic_configs=topic_configs or {},
                )
            ]
        )
    finally:
        await admin.close()
