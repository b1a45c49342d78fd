# sixbit demo on a CUDA host:   docker build -t sixbit . && docker run --gpus all -p 7860:7860 sixbit
# Serves the embedded sixbit-mini by default; -e SIXBIT_MODEL=THUDM/CogVideoX-2b serves a Hub model
# (mount a Hugging Face cache at /home/user/.cache/huggingface to keep downloads). See docs/DEPLOY.md.
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1

# python3-dev + gcc: Triton compiles its small launcher stubs with the host C compiler at run time.
# libglib2.0-0: needed by OpenCV (optical-flow metric). ffmpeg comes with imageio-ffmpeg.
# Unpinned on purpose: the base image's Ubuntu release fixes the versions.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libglib2.0-0 ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# Non-root user with uid 1000 (the uid Hugging Face Spaces runs Docker images as). The Ubuntu 24.04
# base image already has a user "ubuntu" with that uid: remove it first.
RUN (userdel -r ubuntu 2>/dev/null || true) && useradd -m -u 1000 -s /bin/bash user
USER 1000
ENV HOME=/home/user \
    PATH=/home/user/venv/bin:$PATH
WORKDIR /home/user/app
RUN python3 -m venv /home/user/venv

# torch first, as a CUDA build (the version the Hopper kernels were measured with); then the rest.
ARG TORCH_SPEC="torch==2.11.0"
ARG TORCH_INDEX="https://download.pytorch.org/whl/cu128"
COPY --chown=user requirements.txt ./
# torch is pinned through TORCH_SPEC (hadolint cannot see an ARG's value); the rest by requirements.txt.
# hadolint ignore=DL3013
RUN pip install --index-url "$TORCH_INDEX" "$TORCH_SPEC" \
 && pip install -r requirements.txt

COPY --chown=user . .
RUN pip install --no-deps .

ENV GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860 \
    GRADIO_ANALYTICS_ENABLED=False
EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/', timeout=8)"]
CMD ["python3", "app.py"]
