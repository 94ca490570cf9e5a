from common.params import choice_param, id_param, time_param  # noqa: F401  # moved: common.params
