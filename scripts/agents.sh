# Sourced by scripts/up.sh: two simulated GPU agents for `make up`. Each gets a fresh node key
# (only its public half is stored) and the control side's public key; job logs and agent
# state go under $FLEET_VAR_DIR/agents/<name>/ (var/ by default).
# Uses BIN and start() from up.sh.
control_key=$($BIN/python manage.py control_key)
start_sim_agent() {  # name, GPU spec
  local name=$1 spec=$2 key
  key=$($BIN/python manage.py add_node "$name" 2>/dev/null | tail -n 1)
  mkdir -p "$VAR/agents/$name"
  start "agent-$name" env FLEET_NODE_KEY="$key" FLEET_CONTROL_PUBLIC_KEY="$control_key" \
    FLEET_AGENT_STATE_DIR="$VAR/agents/$name" \
    FLEET_SIMULATE_GPUS="$spec" $BIN/python -m workers.agent --node "$name"
}
start_sim_agent sim-a 4xA100-80GB
start_sim_agent sim-b 2xV100-32GB
