# NVIDIA's JAX + MaxText image brings CUDA, jax, flax, optax, orbax and Transformer Engine;
# we add this package and the few pure-Python extras on top, leaving their jax untouched.
# The build names the image's Transformer Engine beside the release scripts/te/requirements.txt pins (the one our te
# backend is tested against) and goes on: the te backend checks at run time what it needs from TE. The nightly
# `maxtext` tag builds TE from its main branch. --build-arg TE_CHECK=strict stops the build on any TE but the pinned one.
ARG BASE_IMAGE=ghcr.io/nvidia/jax:maxtext
FROM ${BASE_IMAGE}
ARG TE_CHECK=report
WORKDIR /opt/maxtext-nvfp4
COPY scripts/te/requirements.txt scripts/te/check_version.py scripts/te/
RUN python scripts/te/check_version.py --mode "$TE_CHECK"
COPY requirements.txt .
RUN grep -Ev '^(jax|jaxlib|flax|optax|orbax-checkpoint|numpy)[=\[]' requirements.txt > /tmp/extra-requirements.txt \
 && pip install --no-cache-dir -r /tmp/extra-requirements.txt
COPY . .
RUN pip install --no-cache-dir --no-deps -e .
ENTRYPOINT ["python", "train.py"]
CMD ["configs/llama3_tiny.yml"]
