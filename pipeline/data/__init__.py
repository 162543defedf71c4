"""Data stages. Each is a function `(data, stage_config, ctx) -> StageResult` in a file named after it."""
