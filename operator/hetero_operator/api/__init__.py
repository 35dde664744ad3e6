"""The job's API and the operator's vocabulary: the parsed spec, the plan's value types, settings,
labels, conditions, errors and strict fields (pure; imports no other floor)."""
