"""Pipeline configs: one YAML file per pipeline, checked by pydantic once, at load.

One module per section: `engine` (prompts, sampling, where the engine runs), `verify`,
`select`, `curate` (gates, difficulty, rationalization, the curate pipeline), `train`,
`eval` and `bootstrap`, which composes the curate, train and eval sections. `base` says
how a field counts in identities (thresher.identities). Stages take their own section."""

from thresher.config.base import (
    ConfigError,
    StageConfig,
    TrackingConfig,
    load_config,
    never,
    skipped_by,
)
from thresher.config.bootstrap import (
    AuditGateConfig,
    BootstrapConfig,
    BootstrapTrainConfig,
    FormatConfig,
    MonitorsGateConfig,
    RollbackConfig,
)
from thresher.config.curate import (
    SEALED,
    CurateConfig,
    CurateSections,
    DifficultyConfig,
    GatedStage,
    GatesConfig,
    RationalizeConfig,
)
from thresher.config.engine import (
    EXECUTOR_HELP,
    CompactConfig,
    EngineConfig,
    EngineStage,
    Executor,
    PromptsConfig,
    RayConfig,
    SamplingConfig,
    ServerConfig,
    ToolsConfig,
)
from thresher.config.env import CurriculumConfig, EnvironmentConfig, EnvTaskConfig
from thresher.config.eval import (
    FORGETTING,
    BootstrapEvalConfig,
    EvalConfig,
    ForgettingCheckConfig,
    HeldOut,
    forgetting_name,
)
from thresher.config.select import DecontamConfig, SelectConfig
from thresher.config.train import (
    SELF,
    DistributedConfig,
    EarlyStoppingConfig,
    LoraConfig,
    MixSource,
    TrainConfig,
    TrainDataConfig,
    TrainSettings,
)
from thresher.config.verify import VerifyConfig

__all__ = [
    "CurriculumConfig",
    "EnvironmentConfig",
    "EnvTaskConfig",
    "FormatConfig",
    "EXECUTOR_HELP",
    "FORGETTING",
    "SEALED",
    "SELF",
    "TrackingConfig",
    "AuditGateConfig",
    "BootstrapConfig",
    "BootstrapEvalConfig",
    "BootstrapTrainConfig",
    "CompactConfig",
    "ConfigError",
    "CurateConfig",
    "CurateSections",
    "DecontamConfig",
    "DifficultyConfig",
    "DistributedConfig",
    "EarlyStoppingConfig",
    "EngineConfig",
    "EngineStage",
    "EvalConfig",
    "Executor",
    "ForgettingCheckConfig",
    "GatedStage",
    "GatesConfig",
    "HeldOut",
    "LoraConfig",
    "MixSource",
    "MonitorsGateConfig",
    "PromptsConfig",
    "RationalizeConfig",
    "RayConfig",
    "RollbackConfig",
    "SamplingConfig",
    "ToolsConfig",
    "SelectConfig",
    "ServerConfig",
    "StageConfig",
    "TrainConfig",
    "TrainDataConfig",
    "TrainSettings",
    "VerifyConfig",
    "forgetting_name",
    "load_config",
    "never",
    "skipped_by",
]
