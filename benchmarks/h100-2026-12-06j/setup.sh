# Source me on the device: the wheels the image lacks into /tmp/site, PYTHONPATH, the card into $OUT/gpu.txt.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch; print('torch', torch.__version__)" | tee -a $OUT/gpu.txt
nproc | sed 's/^/cpus /' | tee -a $OUT/gpu.txt
