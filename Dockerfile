# NVIDIA's JAX + MaxText image brings CUDA, jax, flax, optax, orbax and Transformer Engine;
# we add this package and the few pure-Python extras on top, leaving their jax untouched.
# The image's TE must be the release scripts/te/requirements.txt pins (2.20.2), which our te backend is tested
# against: the build checks it and stops with a one-line error where the image has another (the nightly `maxtext`
# tag builds TE from its main branch). Choose an image that ships it (--build-arg BASE_IMAGE=...), or build on the
# image's own TE with --build-arg TE_CHECK=warn.
ARG BASE_IMAGE=ghcr.io/nvidia/jax:maxtext
FROM ${BASE_IMAGE}
ARG TE_CHECK=strict
WORKDIR /opt/maxtext-nvfp4
COPY scripts/te/requirements.txt scripts/te/check_version.py scripts/te/
RUN python scripts/te/check_version.py $([ "$TE_CHECK" = warn ] && echo --warn)
COPY requirements.txt .
RUN grep -Ev '^(jax|jaxlib|flax|optax|orbax-checkpoint|numpy)[=\[]' requirements.txt > /tmp/extra-requirements.txt \
 && pip install --no-cache-dir -r /tmp/extra-requirements.txt
COPY . .
RUN pip install --no-cache-dir --no-deps -e .
ENTRYPOINT ["python", "train.py"]
CMD ["configs/llama3_tiny.yml"]
