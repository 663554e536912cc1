#!/usr/bin/env bash
# gpuslice on a kind cluster with a real NVIDIA GPU, through the gpuslice DRA driver:
# from an empty cluster to `nvidia-smi` in a pod showing 8192 MiB on a 32 GB card.
#
# NOT RUN IN CI, AND NOT RUN BY THE AUTHORS: no machine this project is developed and tested
# on can run Kubernetes or has a GPU. It is the operator's recipe, written from the kind, NVIDIA
# container toolkit and DRA documentation; expect to adapt it. What IS tested is listed in
# docs/architecture.md ("Kubernetes DRA driver").
#
# Needs on the host: an NVIDIA GPU with its driver, docker, the NVIDIA container toolkit
# (nvidia-ctk) configured for docker, kind >= 0.30 and kubectl. The node image must be
# Kubernetes 1.34+ (resource.k8s.io/v1). Usage: docker/kind-dra.sh [products|capacity|units]
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=${1:-products}
CLUSTER=${CLUSTER:-gpuslice}
NODE_IMAGE=${NODE_IMAGE:-kindest/node:v1.34.0}
for tool in kind kubectl docker nvidia-ctk nvidia-smi; do
    command -v "$tool" >/dev/null || { echo "kind-dra.sh: $tool is missing" >&2; exit 2; }
done

# 1. Let docker hand GPUs to kind's node container by volume mount (NVIDIA's kind recipe).
sudo nvidia-ctk runtime configure --runtime=docker --set-as-default --cdi.enabled
sudo nvidia-ctk config --set accept-nvidia-visible-devices-as-volume-mounts=true --in-place
sudo systemctl restart docker

# 2. The cluster: DRA's alpha gates for the chosen model, the GPUs mounted into the worker.
cat <<CONFIG | kind create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --config -
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
featureGates:
  DRAPartitionableDevices: true
  DRAConsumableCapacity: true
  DRADeviceTaints: true
  DRAExtendedResource: true
nodes:
  - role: control-plane
  - role: worker
    extraMounts:
      - hostPath: /dev/null
        containerPath: /var/run/nvidia-container-devices/all
CONFIG
WORKER="$CLUSTER-worker"

# 3. In the worker: the NVIDIA toolkit, NVIDIA's CDI spec (/var/run/cdi/nvidia.yaml, which
#    gpuslice-dra --nvidia-cdi=auto finds), an `nvidia` runtime for the driver pod's NVML.
docker exec "$WORKER" bash -c '
  set -e
  apt-get update -q && apt-get install -y -q curl gpg
  curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey |
    gpg --dearmor -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
  curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list |
    sed "s#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://#" \
    > /etc/apt/sources.list.d/nvidia-container-toolkit.list
  apt-get update -q && apt-get install -y -q nvidia-container-toolkit
  nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml
  nvidia-ctk runtime configure --runtime=containerd --cdi.enabled
  systemctl restart containerd
  # No static slices: the installer DaemonSet writes none (--allow-none).
  mkdir -p /etc/gpuslice/slices'
kubectl label node "$WORKER" nvidia.com/gpu.present=true --overwrite
kubectl apply -f - <<'RC'
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: nvidia
handler: nvidia
RC

# 4. Images: the installer (libgpuslice.so into /opt/gpuslice) and the driver.
docker build -f docker/Dockerfile -t gpuslice:kind .
docker build -f docker/Dockerfile --target dra -t gpuslice-dra:kind .
kind load docker-image --name "$CLUSTER" gpuslice:kind gpuslice-dra:kind

# 5. gpuslice: installer, driver (model as asked), classes, admission policies, claim
#    templates and quota.
sed 's#registry.example.com/gpuslice:0.1.0#gpuslice:kind#' docker/k8s/installer-daemonset.yaml |
    kubectl apply -f -
sed -e 's#registry.example.com/gpuslice-dra:0.1.0#gpuslice-dra:kind#' \
    -e "s#--model=products#--model=$MODEL#" docker/k8s/dra-driver.yaml | kubectl apply -f -
kubectl apply --server-side -f docker/k8s/deviceclass.yaml -f docker/k8s/admission-policies.yaml
kubectl apply --server-side -n default -k docker/k8s/tenant
kubectl -n kube-system rollout status daemonset/gpuslice-installer --timeout=300s
kubectl -n kube-system rollout status daemonset/gpuslice-dra --timeout=300s
until kubectl get resourceslices -o name | grep -q gpuslice.dev; do sleep 2; done
kubectl get resourceslices -o yaml

# 6. Two pods sharing one 25% claim; each prints the slice's memory.
if [ "$MODEL" = products ]; then
    kubectl apply -f docker/k8s/pod-shared-claim.yaml
    kubectl wait --for=condition=Ready pod/smi-a pod/smi-b --timeout=300s
    kubectl logs smi-a   # expected on a 32 GB card: memory.total [MiB] / 8192 MiB
    kubectl logs smi-b
fi
echo "kind-dra.sh: done; delete with: kind delete cluster --name $CLUSTER"
