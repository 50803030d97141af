from launcher import lean_imports

lean_imports.install()
