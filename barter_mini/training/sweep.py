"""Grids of training runs through submitit: on this machine or on a Slurm cluster.

A sweep trains every run of a grid (methods x densities x seeds, or the notebooks' grids,
listed by :mod:`barter_mini.book.plans`) into the run cache that the notebooks read
(:func:`~barter_mini.training.cache.run_dir`), one submitit job per run. Each job is a
:class:`TrainingJob`: :func:`~barter_mini.training.cache.cached_train` of its run, which
resumes an interrupted attempt from its ``last.pt`` and renames the run folder into place
only when complete. The job is ``submitit.helpers.Checkpointable``, so a Slurm job that is
preempted or reaches its time limit is requeued by submitit with the same arguments and
continues from the last checkpoint.

Scheduling is the library's: ``--executor slurm`` submits one job array
(``submitit.SlurmExecutor``; Slurm runs ``--array-parallelism`` of them at once), and
``--executor local`` starts submitit's ``LocalExecutor`` jobs, each in its own process, from
a thread pool of ``--jobs`` threads (``concurrent.futures``), which is what bounds how many
train at once: the local executor itself starts every job it is given immediately. Each
local job sets torch's threads to its share of the cores (``--jobs 2`` on two cores: one
each), so side-by-side runs do not oversubscribe the machine.

A run whose results the cache holds is skipped (not even submitted); a run another process
is training now (its lock is taken) is reported as busy and not submitted; a failed run is
reported with its submitit log and the others go on. A grid whose runs depend on other runs'
results comes in :class:`Stage` s, each listed only when the earlier stages are complete
(listing reads the cache and never trains); a stage with a failed or busy run stops the
sweep before the stages that may need it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import submitit
import torch

from ..errors import BarterError, check_integer, choose
from .cache import TRAIN_ENV, cached_train, check_cache_dir, entry_state, run_dir, run_is_locked
from .methods import check_methods, get_method
from .run_config import RunConfig
from .trusted_folders import check_trusted_folder

EXECUTORS = ("local", "slurm")
#: a local job's time limit when none is given: submitit's own default (2 minutes) would
#: stop every real run; a week is "no limit" for a run on one machine
LOCAL_TIME_MIN = 7 * 24 * 60
#: a Slurm job's time limit when none is given (the partition may allow less)
SLURM_TIME_MIN = 24 * 60
#: how often a waiting sweep asks Slurm about its jobs (seconds)
SLURM_POLL_S = 30.0
#: the outcomes of a run in a sweep, in the order the summary lists them
STATES = ("trained", "skipped", "failed", "busy")


@dataclass(frozen=True)
class Stage:
    """Runs that may train at the same time. ``runs`` is called only once every earlier
    stage is complete, so it may read their results from the cache (a pretrained checkpoint,
    a compute budget, a final allocation); it never trains (the cache is read-only then)."""

    name: str
    runs: Callable[[], list[RunConfig]]


def grid_runs(methods: Sequence[str], densities: Sequence[float], seeds: Sequence[int],
              **settings) -> list[RunConfig]:
    """``methods x densities x seeds`` as RunConfigs with the same other ``settings`` (model,
    dataset, recipe, epochs, train_subset, ...); a method with a fixed density (dense) once
    per seed, at that density."""
    methods = check_methods(methods)
    if not densities or not seeds:
        raise BarterError("a grid needs at least one density and one seed")
    for seed in seeds:
        check_integer("seed", seed, minimum=0)
    runs = []
    for method in methods:
        fixed = get_method(method).fixed_density
        for density in ([fixed] if fixed is not None else densities):
            runs += [RunConfig(method=method, density=density, seed=seed, **settings).validate() for seed in seeds]
    return runs


def default_logs() -> Path:
    """submitit's folder when ``--logs`` is not given: ``barter-mini/sweep-logs`` in the user's
    cache folder (``$XDG_CACHE_HOME``, else ``~/.cache``), private to the user and never beside a
    run cache that others may share. On a cluster the home folder is the one the nodes see."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "barter-mini" / "sweep-logs"


@dataclass(frozen=True)
class ExecutorSettings:
    """Where the jobs run. ``local``: ``jobs`` at once on this machine. ``slurm``: one array
    job on ``partition`` (None: the cluster's default) with ``gpus_per_job`` GPUs and
    ``cpus_per_job`` CPUs per run, at most ``array_parallelism`` running at once (None: as
    many as Slurm allows). ``time_min``: each job's time limit in minutes (None:
    :data:`LOCAL_TIME_MIN` or :data:`SLURM_TIME_MIN`); a job that reaches it is requeued and
    resumes. ``logs``: submitit's folder (job pickles, stdout and stderr per job; :func:`default_logs`)."""

    kind: str = "local"
    logs: Path = field(default_factory=default_logs)
    jobs: int = 1
    partition: str | None = None
    gpus_per_job: int = 0
    cpus_per_job: int | None = None
    time_min: int | None = None
    array_parallelism: int | None = None
    #: torch threads of each run (None: locally the machine's cores shared out among the
    #: ``jobs`` runs, on Slurm ``cpus_per_job``, else torch's default)
    threads_per_job: int | None = None

    def threads(self, runs: int | None = None) -> int | None:
        """Each job's torch threads when ``runs`` runs are to train (None: many): runs training
        side by side must not each start one thread per core, or they fight over the cores
        (``--jobs 2`` on two cores: one each), and a stage of one run gets every core."""
        if self.threads_per_job is not None:
            return self.threads_per_job
        if self.kind == "local":
            return max(1, len(os.sched_getaffinity(0)) // min(self.jobs, runs or self.jobs))
        return self.cpus_per_job

    def validate(self) -> "ExecutorSettings":
        choose("executor", self.kind, EXECUTORS)
        check_integer("jobs", self.jobs)
        check_integer("gpus per job", self.gpus_per_job, minimum=0)
        for name, value in (("cpus per job", self.cpus_per_job), ("time (minutes)", self.time_min),
                            ("array parallelism", self.array_parallelism), ("threads per job", self.threads_per_job)):
            if value is not None:
                check_integer(name, value)
        if self.kind == "local" and (self.partition or self.array_parallelism):
            raise BarterError("--partition and --array-parallelism are Slurm's: give them with --executor slurm "
                              "(locally, --jobs says how many runs train at once)")
        if self.kind == "slurm" and self.jobs != 1:
            raise BarterError("--jobs is the local executor's: on Slurm, --array-parallelism says how many "
                              "runs train at once")
        return self


def default_gpus_per_job(executor: str, device: str | None, given: int | None) -> int:
    """GPUs each job sees: ``given``, else one on Slurm; locally one where the runs train on
    CUDA (``--device cuda``, or auto with a GPU here): every local job then sees the same
    GPU 0 and the runs share its memory. Locally with none, the jobs see no GPU at all."""
    wants_cuda = device == "cuda" or (device in (None, "auto") and torch.cuda.is_available())
    if given is not None:
        if executor == "local" and device == "cuda" and given == 0:
            raise BarterError("--device cuda needs the jobs to see the GPU: leave --gpus-per-job unset (each local "
                              "job then sees GPU 0, shared) or give 1")
        return given
    return 1 if executor == "slurm" or wants_cuda else 0


def private_folder(folder: Path) -> Path:
    """The path to ``folder`` that the check walked (links resolved: the folder that passed,
    whatever a link on the way points to later), created ``0700`` if missing, once it is this
    user's own and neither it nor any folder or link on the way can be changed by another user
    (:func:`~barter_mini.training.trusted_folders.walk_trusted_folder`); else a one-line error.

    submitit keeps each job's arguments and result there as pickles, which the jobs and the
    sweep unpickle: anyone who could write that folder, or rename it from the folder above,
    could swap them for pickles that run their code in the sweep's account. Slurm's nodes run
    the jobs as the same user, so a private folder costs nothing."""
    return check_trusted_folder(folder, f"submitit's folder {folder} (--logs)", create=True, private=True)


def make_executor(settings: ExecutorSettings) -> submitit.Executor:
    """The submitit executor of ``settings``: its logs folder and its job's resources."""
    settings = settings.validate()
    logs = private_folder(settings.logs)
    if settings.kind == "local":
        executor = submitit.LocalExecutor(folder=logs)
        executor.update_parameters(timeout_min=settings.time_min or LOCAL_TIME_MIN,
                                   gpus_per_node=settings.gpus_per_job)
        return executor
    if shutil.which("srun") is None or shutil.which("sbatch") is None:
        raise BarterError("--executor slurm needs Slurm's sbatch and srun on the PATH (run the sweep on the "
                          "cluster's login node), or use --executor local")
    executor = submitit.SlurmExecutor(folder=logs)
    resources = {"partition": settings.partition, "cpus_per_task": settings.cpus_per_job,
                 "array_parallelism": settings.array_parallelism}
    executor.update_parameters(time=settings.time_min or SLURM_TIME_MIN, nodes=1, ntasks_per_node=1,
                               gpus_per_node=settings.gpus_per_job,
                               **{key: value for key, value in resources.items() if value is not None})
    return executor


class TrainingJob(submitit.helpers.Checkpointable):
    """One submitit job: train ``run`` into ``cache_dir`` (or find it there) and return a
    short summary. On preemption or at its time limit submitit calls its ``checkpoint()``
    (inherited from ``submitit.helpers.Checkpointable``), which resubmits this same job; the
    new attempt resumes from ``last.pt``."""

    def __init__(self, run: RunConfig, cache_dir: Path, folder_name: str, checkpoint_every: int | None = None,
                 threads: int | None = None):
        self.run = run
        self.cache_dir = Path(cache_dir)
        #: the cache folder the sweep expects: the job refuses to train under another key
        self.folder_name = folder_name
        self.checkpoint_every = checkpoint_every
        self.threads = threads

    def __call__(self) -> dict:
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        target = run_dir(self.run.validate(), self.cache_dir)
        if target.name != self.folder_name:
            raise BarterError(f"the training source changed since the sweep listed run {self.folder_name} "
                              f"(its key is now {target.name}): rerun the sweep")
        metrics = cached_train(self.run, self.cache_dir, train_missing=True,
                               checkpoint_every=self.checkpoint_every)
        return {"run": target.name, "test_acc": metrics["test_acc"], "wall_time_s": metrics["wall_time_s"]}


@dataclass
class RunOutcome:
    """What a sweep did with one run: ``state`` is one of :data:`STATES` (or, in a dry run, "to train")."""

    name: str
    state: str
    #: the job's stderr file (submitit's), for a run that was submitted
    log: Path | None = None
    #: a failed run's error, one line
    error: str | None = None

    def line(self) -> str:
        where = f" (log: {self.log})" if self.log else ""
        return f"{self.state} {self.name}" + (f": {self.error}" if self.error else "") + where


@dataclass
class SweepReport:
    """Every run's outcome, and the stages not started because an earlier one is incomplete."""

    outcomes: list[RunOutcome] = field(default_factory=list)
    stages_not_started: list[str] = field(default_factory=list)
    #: why those stages did not start
    not_started_because: str = "they need the failed or busy runs"

    def count(self, state: str) -> int:
        return sum(outcome.state == state for outcome in self.outcomes)

    @property
    def complete(self) -> bool:
        """Whether every run of every stage is in the cache now."""
        return not self.stages_not_started and all(o.state in ("trained", "skipped") for o in self.outcomes)

    def summary(self) -> str:
        states = list(STATES) + sorted({o.state for o in self.outcomes} - set(STATES))   # a dry run's "to train"
        counts = ", ".join(f"{self.count(state)} {state}" for state in states)
        waiting = (f"; stages not started ({self.not_started_because}): {', '.join(self.stages_not_started)}"
                   if self.stages_not_started else "")
        return f"sweep: {len(self.outcomes)} runs: {counts}{waiting}"


def job_error(job: submitit.Job) -> str | None:
    """A finished job's error in one line (the last line of its traceback), or None."""
    error = job.exception()
    if error is None:
        return None
    if not isinstance(error, submitit.core.utils.FailedJobError):     # no traceback: no result at all
        return "the job ended without a result: its process was killed (a signal, out of memory) or timed out"
    lines = [line.strip() for line in str(error).splitlines()]
    # a FailedJobError holds the job's traceback between two dashed lines: its last line
    # is the exception; other errors (no result: the process was killed) say so first
    raised = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupted|Exit)\b", line)]
    return raised[-1] if raised else (lines[0] if lines else type(error).__name__)


@contextlib.contextmanager
def read_only_cache() -> Iterator[None]:
    """Forbid training in this process (``$BARTER_MINI_TRAIN=0``) while a stage lists its runs."""
    before = os.environ.get(TRAIN_ENV)
    os.environ[TRAIN_ENV] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TRAIN_ENV, None)
        else:
            os.environ[TRAIN_ENV] = before


def plan_stage(runs: Sequence[RunConfig], cache_dir: Path, seen: set[str],
               log=print) -> tuple[list, list[RunOutcome]]:
    """Split a stage's runs into those to submit, ``(run, folder name)``, and the outcomes of
    those that need no job (complete in the cache, or being trained elsewhere); runs listed
    before (in this stage or an earlier one) are left out. A damaged cache entry
    (:func:`~barter_mini.training.cache.entry_state`) is logged in one line and trained again."""
    submit, settled = [], []
    for run in runs:
        target = run_dir(run.validate(), cache_dir)
        if target.name in seen:
            continue
        seen.add(target.name)
        state, damage = entry_state(target, run)
        if state == "complete":
            settled.append(RunOutcome(target.name, "skipped"))
            continue
        if state == "damaged":
            log(f"damaged {target.name}: {damage}; it is trained again")
        if run_is_locked(target):
            settled.append(RunOutcome(target.name, "busy", error="another process is training it now"))
        else:
            submit.append((replace(run, progress=False), target.name))
    return submit, settled


def _outcome(job: submitit.Job, name: str) -> RunOutcome:
    error = job_error(job)
    return RunOutcome(name, "failed" if error else "trained", log=Path(job.paths.stderr), error=error)


def _run_local(executor, submit, cache_dir: Path, jobs: int, checkpoint_every, threads, log) -> list[RunOutcome]:
    submitting = threading.Lock()        # submitit's executors are not documented as thread-safe

    def train_one(item) -> RunOutcome:
        run, name = item
        with submitting:
            job = executor.submit(TrainingJob(run, cache_dir, name, checkpoint_every, threads))
        log(f"started {name} (job {job.job_id}, log {job.paths.stderr})")
        job.wait()
        outcome = _outcome(job, name)
        log(outcome.line())
        return outcome

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(train_one, submit))


def _run_slurm(executor, submit, cache_dir: Path, checkpoint_every, threads, log) -> list[RunOutcome]:
    with executor.batch():               # one job array: Slurm applies --array-parallelism
        jobs = [executor.submit(TrainingJob(run, cache_dir, name, checkpoint_every, threads)) for run, name in submit]
    names = {job.job_id: name for job, (_, name) in zip(jobs, submit)}
    log(f"submitted {len(jobs)} runs as Slurm job array {jobs[0].job_id.split('_')[0]}; waiting for them "
        "(stopping this command does not cancel them; rerun it to see or resume them)")
    outcomes = []
    for job in submitit.helpers.as_completed(jobs, poll_frequency=SLURM_POLL_S):
        outcomes.append(_outcome(job, names[job.job_id]))
        log(outcomes[-1].line())
    return outcomes


def run_sweep(stages: Sequence[Stage], settings: ExecutorSettings, cache_dir: Path | None = None,
              checkpoint_every: int | None = None, dry_run: bool = False, log=print) -> SweepReport:
    """Train every run of ``stages`` that the cache lacks, stage after stage; return what
    happened to each. ``dry_run`` lists what would be submitted and submits nothing (a later
    stage is then listed only as far as the cache already allows)."""
    settings = settings.validate()
    if checkpoint_every is not None:
        check_integer("checkpoint every", checkpoint_every)
    cache_dir = check_cache_dir(cache_dir, writable=not dry_run)    # before any job
    executor = None if dry_run else make_executor(settings)
    report, seen = SweepReport(), set()
    for index, stage in enumerate(stages):
        with read_only_cache():
            try:
                runs = stage.runs()
            except BarterError as error:
                if not dry_run:
                    raise
                log(f"stage {stage.name}: cannot be listed before the earlier stages are trained ({error})")
                report.stages_not_started += [s.name for s in stages[index:]]
                report.not_started_because = "a dry run lists a stage only once the earlier ones are trained"
                break
        submit, settled = plan_stage(runs, cache_dir, seen, log)
        log(f"stage {stage.name}: {len(submit)} runs to train, "
            f"{sum(o.state == 'skipped' for o in settled)} already in {cache_dir}")
        for outcome in settled:
            if outcome.state == "busy":
                log(outcome.line())
        report.outcomes += settled
        if dry_run:
            report.outcomes += [RunOutcome(name, "to train") for _, name in submit]
            for _, name in submit:
                log(f"would train {name}")
            continue
        if submit:
            if settings.kind == "local":
                report.outcomes += _run_local(executor, submit, cache_dir, settings.jobs, checkpoint_every,
                                              settings.threads(len(submit)), log)
            else:
                report.outcomes += _run_slurm(executor, submit, cache_dir, checkpoint_every, settings.threads(), log)
        names = {name for _, name in submit} | {o.name for o in settled}
        if any(o.state in ("failed", "busy") for o in report.outcomes if o.name in names) and index + 1 < len(stages):
            report.stages_not_started = [s.name for s in stages[index + 1:]]
            break
    return report


def sweep_grid_stage(methods, densities, seeds, **settings) -> list[Stage]:
    """A plain grid as the single stage of a sweep (:func:`grid_runs`)."""
    runs = grid_runs(methods, densities, seeds, **settings)      # checked now, before any job
    return [Stage("grid", lambda: runs)]

