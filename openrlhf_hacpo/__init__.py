"""openrlhf-hacpo: Heterogeneous Agent Collaborative Policy Optimization (HACPO) for N heterogeneous LLM agents."""

__version__ = "0.1.0"
