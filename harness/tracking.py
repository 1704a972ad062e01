"""W&B (--track): a W&B run per member of a run, continued by --resume, and --evaluate's record in the run's own.

wandb is imported only when --track asks for it: a run without it needs no wandb installed.
"""

from __future__ import annotations

from pathlib import Path


def start_wandb(args, configs: list[dict], dirs: list[Path], ids: list[str] | None, sent: list[int],
                records: list[int]) -> tuple[list, list[int]]:
    """(a W&B run per seed, the records each already has), each run's step being the record's line in metrics.jsonl
    (its x-axis global_step, a metric of its own, so a record may come at any global_step: an evaluation run again
    after a resume included). A resumed run continues its W&B run: resume="allow" with its id (any account, online or
    offline), and the records W&B already has (the lines written before the stop, after the checkpoint too) are not
    sent again; --wandb-resume rewind cuts W&B's history back to the checkpoint instead (W&B's run rewind, a preview
    feature), fork starts a new W&B run from it."""
    import wandb

    runs, already = [], [0] * len(configs)
    for i, (config, path) in enumerate(zip(configs, dirs, strict=True)):
        how = {}
        if ids and args.wandb_resume == "allow":
            how, already[i] = {"id": ids[i], "resume": "allow"}, sent[i]
        elif ids and args.wandb_resume == "rewind":
            how = {"resume_from": f"{ids[i]}?_step={records[i]}"}
        elif ids:
            how = {"fork_from": f"{ids[i]}?_step={records[i]}"}
        runs.append(wandb.init(project=args.wandb_project_name, entity=args.wandb_entity,
                               group=args.wandb_group, name=path.name, config=config,
                               dir=str(path.resolve()),  # absolute: wandb-core resolves from its own cwd
                               save_code=True, reinit="create_new", **how))
        runs[-1].define_metric("global_step")
        runs[-1].define_metric("*", step_metric="global_step")
    return runs, already


def finish_wandb(run, path: Path, step: int, record: int, summary: dict) -> None:
    """A seed's W&B run closed: the final evaluation's video (if any) at `record`, the summary's numbers."""
    video = path / "videos" / "eval-episode-0.mp4"
    if video.exists():
        import wandb

        run.log({"global_step": step, "media/video": wandb.Video(str(video))}, step=record)
    run.summary.update({k: v for k, v in summary.items() if not isinstance(v, list)})
    run.finish()


def log_evaluation(args, directory: Path, mean: float, std: float, video: Path | None) -> None:
    """--evaluate --track: the result (and the video) into the run's own W&B run."""
    import wandb

    ids = [path.name.rsplit("-", 1)[-1] for path in sorted((directory / "wandb").glob("*run-*-*"))]
    run = wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, id=ids[-1] if ids else None,
                     resume="allow", dir=str(directory.resolve()))
    run.log({"evaluate/return_mean": mean, "evaluate/return_std": std}
            | ({"evaluate/video": wandb.Video(str(video))} if video else {}))
    run.finish()
