"""The typed configs behind configs/*.yaml, and how a command line becomes one.

schemas.py  the sections and jobs as dataclasses (data.*, tokenizer.*, train.*, eval.*, logger.*, paths.*, hf.*,
            TrainJob, EvalJob); LMConfig (model.py) is model.*, each scheme's Options (positions/) position.*
compose.py  Hydra composition (compose, to_job, typed), the resolvers, the schemas in the ConfigStore
device.py   device, precision, CPU threads, writable folders
"""

from .compose import CONFIG_DIR, compose, config_name, model_config, register_schemas, run_folder, to_job, typed
from .device import apply_cpu_threads, autocast_dtype, check_writable, resolve_device, set_cpu_threads
from .schemas import (
    DEFAULT_TASK_EXAMPLES,
    DEVICES,
    PRECISIONS,
    DataConfig,
    EvalConfig,
    EvalJob,
    HFConfig,
    LoggerConfig,
    PathsConfig,
    RopeScalingConfig,
    SubjectJob,
    SubjectPathsConfig,
    TokenizerConfig,
    TrainConfig,
    TrainJob,
    WandbConfig,
    check_device,
    check_fits,
    run_results_root,
)

__all__ = ["CONFIG_DIR", "DEFAULT_TASK_EXAMPLES", "DEVICES", "PRECISIONS", "DataConfig", "EvalConfig", "EvalJob",
           "HFConfig", "LoggerConfig", "PathsConfig", "RopeScalingConfig", "SubjectJob", "SubjectPathsConfig",
           "TokenizerConfig", "TrainConfig", "TrainJob", "WandbConfig", "apply_cpu_threads", "autocast_dtype",
           "check_device", "check_fits", "check_writable", "compose", "config_name", "model_config",
           "register_schemas", "resolve_device", "run_folder", "run_results_root", "set_cpu_threads", "to_job",
           "typed"]
