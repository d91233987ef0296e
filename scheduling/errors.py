"""The scheduling model's errors: one, for annotations the time model cannot use.

The model is pure (no I/O, no process edge of its own); its callers translate: the extender
answers 400 (:mod:`scheduler_plugin.app`), the Dataset controller skips the pod. It derives
from the platform's one base (:mod:`dsplatform.errors`), as every package's tree does.

    dsplatform.errors.InvalidInput (400, exit 2, INVALID_ARGUMENT)
    └── AnnotationError                       timemodel: a time-model annotation that cannot be used
"""
