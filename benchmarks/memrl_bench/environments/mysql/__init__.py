"""The MySQL server an LLB-DB run shares (`server`: acquire/release and its users), its address
(`address`), MariaDB made to answer as MySQL 8 (`mysql8_compat`), and the two ways to run it: a local
MariaDB (`mariadb_local`) or one in Docker (`mariadb_docker`)."""
