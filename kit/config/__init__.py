"""What a run is: workloads, platforms, the user's request and the resolved, validated config."""
