"""Node-local block cache: block keys and math, the tiered store (MEM over SSD/HDD)."""
