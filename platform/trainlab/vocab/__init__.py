"""The vocabulary every layer shares: names, specs and catalogs that import nothing of trainlab above them."""
