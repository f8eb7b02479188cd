"""What the replay of a gradbridge-spark run takes from the history the run wrote.

Every line of such a history records the tasks' intra-op thread count (``threads``) and the run's settings
(``sharded``: partitions, batch size, seed, shuffling, the rule by which a step combines its partitions, the
data's digest in its partitions). ``read`` checks them, the same in every line, and hands them to
``reference.train_sharded(..., run=)`` and ``gradbridge parity --spark-history``: a history that lacks one, or
whose lines disagree, is refused in one line naming the file, the epoch and the key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Tuple, Union

from . import messages, protocol
from .errors import InvalidInputError
from .history import History, ShardedRun


@dataclass(frozen=True)
class SparkRun:
    """A gradbridge-spark run as its history records it."""
    #: where the history came from (its file), for lines
    source: str
    history: History
    settings: ShardedRun
    threads: int

    @property
    def epochs(self) -> Tuple[int, ...]:
        """The epochs the history holds, in order (a resumed run's start after 0)."""
        return tuple(record.epoch for record in self.history)


def read(run: Union[str, os.PathLike, History, SparkRun], source: str = "the run's history") -> SparkRun:
    """The run of a history: its file (``History.load``), a History already read (``source`` names it in lines),
    or a SparkRun as it is. Raises InvalidInputError (one line) where a line lacks ``threads`` or ``sharded``,
    holds another rule than ``protocol.SHARDED_RULE``, differs from the first line in either, or its epochs
    are not in order."""
    if isinstance(run, SparkRun):
        return run
    if not isinstance(run, History):
        source = str(run)
        if not Path(run).is_file():
            raise InvalidInputError(f"{source}: no such file")
        run = History.load(Path(run))
    if not len(run):
        raise InvalidInputError(f"{source}: no epoch recorded")
    first = run[0]
    for index, record in enumerate(run):
        where = f"{source} (epoch {record.epoch})"
        for key in ("threads", "sharded"):
            if getattr(record, key) is None:
                raise InvalidInputError(messages.spark_history_key(where, key))
        if record.sharded.rule != protocol.SHARDED_RULE:
            raise InvalidInputError(messages.spark_history_rule(where, record.sharded.rule, protocol.SHARDED_RULE))
        if index and record.epoch <= run[index - 1].epoch:
            raise InvalidInputError(messages.spark_history_order(where, record.epoch, run[index - 1].epoch))
        if record.threads != first.threads:
            raise InvalidInputError(messages.spark_history_differs(where, "threads", record.threads,
                                                                   f"epoch {first.epoch}"))
        if record.sharded != first.sharded:
            raise InvalidInputError(messages.spark_history_differs(where, "sharded", record.sharded.to_json(),
                                                                   f"epoch {first.epoch}"))
    return SparkRun(source, run, first.sharded, first.threads)
