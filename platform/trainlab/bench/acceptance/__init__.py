"""The GPU acceptance run (`trainlab bench acceptance`, .ci/gpu-accept): what it trains, its child processes, its table, its tests part and its report."""
