"""The engine-neutral contract between the core and the engines: what a model can do
(capabilities), what it is (its card), and the value types requests become."""
