"""Stands in for transformers' ``tests/utils/test_configuration_utils.py`` (not in the sdist).

``config_common_kwargs``: attributes every ``PreTrainedConfig`` takes, each with a value other than its default, so
that ``ConfigTester.check_config_arguments_init`` proves a config class passes them through to the base class.
"""

config_common_kwargs = {
    "return_dict": False,
    "output_hidden_states": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["BertModel"],
    "id2label": {0: "label"},
    "label2id": {"label": "0"},
    "problem_type": "regression",
}
