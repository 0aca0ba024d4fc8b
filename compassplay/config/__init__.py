"""One pydantic config tree for a whole run: YAML file + dotted KEY=VALUE overrides.

Every knob has a default, a type, a range where it has one, and a description. Errors name the
file, the dotted field and what was expected (`ConfigError`). The sections live in `models`
(run, model, roles, scorer, learner, bootstrap), `task_reward` (task, reward, reference, and the
constants they share: `AZR_CODE_OUTSIDE_REWARD`), `reward_kinds` (what each reward kind needs:
`REWARD_NEEDS`, `GRADIENT_KINDS`) and `infra` (verifiers,
pipeline, eval, logging, cluster); `RunConfig` in `run_config`; reading files, shipped configs,
`base:` and overrides in `files`. Import everything from here.
"""

from __future__ import annotations

from compassplay.config.files import (  # noqa: F401
    SHIPPED_CONFIGS,
    apply_override,
    dump_config,
    load_config,
    merge_sections,
    read_config_file,
    resolve_config,
    shipped_configs,
)
from compassplay.config.infra import (  # noqa: F401
    ActorResources,
    ClusterSection,
    EvalSection,
    LeanActorResources,
    LeanScalingSection,
    LeanSection,
    LoggingSection,
    PipelineSection,
    VerifierSection,
)
from compassplay.config.models import (  # noqa: F401
    BootstrapSection,
    LearnerSection,
    ModelSection,
    ProposerSection,
    RunSection,
    SamplingSection,
    ScorerSection,
    SolverSection,
    TinyModelConfig,
)
from compassplay.config.reward_kinds import (  # noqa: F401
    GRADIENT_KINDS,
    REWARD_NEEDS,
    RewardKind,
    RewardNeeds,
    reward_needs,
)
from compassplay.config.run_config import (  # noqa: F401
    RunConfig,
)
from compassplay.config.section import (  # noqa: F401
    ConfigError,
    Section,
)
from compassplay.config.task_reward import (  # noqa: F401
    AZR_CODE_OUTSIDE_REWARD,
    LeanTaskSection,
    ReferenceSection,
    RewardSection,
    TaskSection,
)

