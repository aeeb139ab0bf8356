# Sourced by the MoE scripts: sets W to mixtral-8x7b-4l, or, on a card under 120 GB (it peaks at
# ~106 GiB), to a copy with 2 of its 4 layers at full width written to /tmp.
W=mixtral-8x7b-4l
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$mem_mib" -lt 120000 ]; then
  W=/tmp/mixtral-8x7b-2l.yaml
  python3 - "$W" <<'PY'
import sys, yaml
from kit.config.loader import load_workload
spec = load_workload("mixtral-8x7b-4l").model_dump(exclude_none=True)
spec.update(name="mixtral-8x7b-2l", num_layers=2,
            description="mixtral-8x7b-4l with 2 of its 4 layers (fits an 80 GB card)")
open(sys.argv[1], "w").write(yaml.safe_dump(spec))
PY
fi
