"""Data-parallel training: gradbridge-spark, ``reference.train_sharded`` and a Spark history's replay."""

from __future__ import annotations

from typing import Any, Sequence

from .runs import batch_size, java_double, json_text


# ---- data-parallel training (gradbridge-spark, reference shards) ----

def data_parallel_methods(module: str, version: int, missing: Sequence[str]) -> str:
    return (f"{module}: protocol {version} module without {', '.join(missing)}, which data-parallel training "
            f"needs (protocol 2); re-export it with this gradbridge version")


def data_parallel_buffers(module: str, buffers: Sequence[str]) -> str:
    return (f"{module}: training writes its buffers [{', '.join(buffers)}] (e.g. BatchNorm statistics), and it has "
            f"no method set_state, which data-parallel training needs to keep them equal across partitions; "
            f"re-export it with this gradbridge version")


#: The most libtorch intra-op threads a run takes (Java: ModuleAccess.MAX_THREADS).
MAX_THREADS = 4096


def replay_threads(threads: int, previous: int, why: str) -> str:
    """The replay of a gradbridge-spark run on libtorch's ``threads`` (``why``: whence the count)."""
    line = f"replaying on {threads} intra-op thread{'s' if threads != 1 else ''}, {why}"
    return line if previous == threads else f"{line} (this process had {previous}; restored after)"


#: Whence a replay's thread count: the run's history, Spark's defaults, the caller.
THREADS_RECORDED = "as the Spark tasks ran ({} records it)"
THREADS_DEFAULT = "as the Spark tasks run on Spark's defaults (one core a task)"
THREADS_GIVEN = "as asked (threads={})"
#: What the replay of a gradbridge-spark run takes from each key of the run's history.
SPARK_HISTORY_KEYS = {"threads": "the tasks' intra-op thread count",
                      "sharded": "the run's partitions, batch size, seed and rule"}


def spark_history_key(where: str, key: str) -> str:
    return (f'{where}: no "{key}" key ({SPARK_HISTORY_KEYS[key]}), which the replay of a gradbridge-spark run takes '
            f"from its history: not a gradbridge-spark run's history, or one written before it recorded that "
            f"(replay such a run with reference.train_sharded(..., shards=, batch_size=, seed=, threads=))")


def spark_history_differs(where: str, key: str, value: Any, first: str) -> str:
    return (f"{where}: \"{key}\" is {json_text(value, 200)}, not as in {first}: one history, one run (replay each "
            f"run's history on its own)")


def spark_history_rule(where: str, rule: Any, known: str) -> str:
    return f'{where}: "sharded" holds rule {json_text(rule)}; this gradbridge replays the rule {json_text(known)} only'


def spark_history_order(where: str, epoch: int, previous: int) -> str:
    return f"{where}: epoch {epoch} after epoch {previous}; a run's history holds its epochs in order, each once"


def spark_history_data(source: str, history: str, partitions: int, actual: str, recorded: str) -> str:
    return (f"{source} is not the data {history}'s run trained on: its digest in {partitions} partitions "
            f"(shards_sha256) is {actual[:16]}..., the run's {recorded[:16]}...; replay it on the rows the run read")


def spark_history_option(option: str) -> str:
    return f"--spark-history replays the run with the settings its history records: {option} is not taken with it"


def input_too_large(name: str, index: Sequence[int], value: float, limit: float) -> str:
    """An online feedback or prediction input value beyond ``--max-input-abs`` (Java: InputMessages.inputTooLarge)."""
    return (f"field '{name}' element [{', '.join(map(str, index))}] is {java_double(value)}, beyond the input magnitude "
            f"limit {java_double(limit)} (--max-input-abs; 0 turns it off)")


def data_parallel_accumulate(module: str, accumulate: int) -> str:
    return (f"{module}: exported with accumulate={accumulate}; data-parallel training splits each mini-batch "
            f"over partitions instead: export it with accumulate=1")
