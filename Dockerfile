# NVIDIA's JAX + MaxText image brings CUDA, jax, flax, optax, orbax and Transformer Engine;
# we add this package and the few pure-Python extras on top, leaving their jax untouched.
FROM ghcr.io/nvidia/jax:maxtext
WORKDIR /opt/maxtext-nvfp4
COPY requirements.txt .
RUN grep -Ev '^(jax|jaxlib|flax|optax|orbax-checkpoint|numpy)[=\[]' requirements.txt > /tmp/extra-requirements.txt \
 && pip install --no-cache-dir -r /tmp/extra-requirements.txt
COPY . .
RUN pip install --no-cache-dir --no-deps -e .
ENTRYPOINT ["python", "train.py"]
CMD ["configs/llama3_tiny.yml"]
