"""Checkpoints and run folders, in one place: the names of what a run writes, verification, saving the training
state and reading it back, publishing folders whole, and planning what to do with an ``output_dir``.

=================================  ==========================================================================
module                             its job
=================================  ==========================================================================
:mod:`~.checkpoints.layout`        names and places (the marker, ``checkpoint-N``, ``.saving-``, the state
                                   files, what ``--overwrite`` removes), and the small records read back
:mod:`~.checkpoints.rng`           every process's random generators as JSON: captured, read and checked, set
:mod:`~.checkpoints.verify`        whether a checkpoint or model folder is whole, without loading a tensor;
                                   what a ``torch.save`` pickle would import, without unpickling it
:mod:`~.checkpoints.state`         the training state written and read back (optimizer, schedule, step,
                                   histories, RNG), and a checkpoint's weights loaded into a model
:mod:`~.checkpoints.publish`       folders written aside and renamed into place; rotation; a full disk;
                                   signals held while a save runs
:mod:`~.checkpoints.folders`       a new run, the same run continued, or one started over; the checkpoint to
                                   resume from
=================================  ==========================================================================

The trainer decides *what* goes into a checkpoint (:meth:`ragen_trainer.trainer.StarPOTrainer.save_checkpoint`);
this package says *where* and *how*, and is the only code that reads one back. Import from the submodules: this
file re-exports nothing, so that ``layout``, ``rng`` and ``verify`` (which the model loader uses) load without torch.
"""
