"""The conformance kits a backend author runs: `conformance` checks a backend's maths against the float64
reference and the session contract; `abi_contract` checks a native library's answers to every fault.

May import: base, model, data, backends.
"""
