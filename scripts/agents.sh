# Sourced by scripts/up.sh: three simulated GPU agents for `make up`. Each gets a fresh node key
# (only its public half is stored) and the control side's public key; job logs and agent
# state go under $FLEET_VAR_DIR/agents/<name>/ (var/ by default). Each is told a host shape
# (CPUs, memory) and a topology group, as a real host would report them: sim-a and sim-c (4
# A100s each, rack-1) can run a 6-GPU job as two members of 3 GPUs, which meet on loopback.
# Uses BIN and start() from up.sh.
control_key=$($BIN/python manage.py control_key)
start_sim_agent() {  # name, GPU spec, CPUs, memory (MB), group
  local name=$1 spec=$2 cpus=$3 memory=$4 group=$5 key
  key=$($BIN/python manage.py add_node "$name" 2>/dev/null | tail -n 1)
  mkdir -p "$VAR/agents/$name"
  start "agent-$name" env FLEET_NODE_KEY="$key" FLEET_CONTROL_PUBLIC_KEY="$control_key" \
    FLEET_AGENT_STATE_DIR="$VAR/agents/$name" \
    FLEET_NODE_CPUS="$cpus" FLEET_NODE_MEMORY_MB="$memory" FLEET_NODE_GROUP="$group" \
    FLEET_SIMULATE_GPUS="$spec" $BIN/python -m workers.agent --node "$name"
}
start_sim_agent sim-a 4xA100-80GB 32 262144 rack-1
start_sim_agent sim-b 2xV100-32GB 16 131072 rack-2
start_sim_agent sim-c 4xA100-80GB 32 262144 rack-1
